package kvmanager

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestRegisterMutatedAgentMetadata (issue 23): signed REGISTERs whose
// agent metadata is a real ucx agent's with its UCX worker address or a
// region's rkey mutated (the address's header byte kept) go through the
// control plane to a live prefill rank on the ucx engine. The rank
// answers every one (REGISTER_ACK; refused ones with a reason naming the
// metadata), never dies, counts the refused blobs, and registers the
// genuine metadata afterwards. Before issue 23 such a REGISTER aborted the
// prefill rank in ucp_ep_create (nixl's TestUCXMetadataFuzzLegacyAborts
// shows it on the engine path).
func TestRegisterMutatedAgentMetadata(t *testing.T) {
	shm := map[string]string{"TLS": "posix,cma,self"}
	p := newTestPrefill(t, func(c *Config) {
		c.Engine = nixl.Config{Engine: nixl.EngineUCX, UCX: shm}
		c.Instance = "md-fuzz-prefill"
	})
	// The decode rank's agent: real memory of the prefill's layout.
	dec, err := nixl.Open(nixl.Config{Name: "md-fuzz-decode", Engine: nixl.EngineUCX, UCX: shm})
	require.NoError(t, err)
	defer dec.Close()
	var kv []wire.Region
	var mem [][]byte
	proof := []byte("the md-fuzz decode's own seed...")
	for range p.cfg.Layout.Regions {
		_, buf, err := dec.Alloc(8*64 + transfer.ProofBytes)
		require.NoError(t, err)
		mem = append(mem, buf)
		kv = append(kv, wire.Region{Addr: uint64(nixl.BytesDesc(buf).Addr), Len: 8 * 64, ItemLen: 64, Mem: wire.MemDRAM})
	}
	lay, err := core.LayoutFrom(kv, []wire.Region{}, []wire.Region{})
	require.NoError(t, err)
	for i, pr := range proofRegions(lay) {
		copy(mem[i][8*64:], pr.value(proof, "decode/md-fuzz-decode/0")) // its ownership proof, after the region
	}
	md, err := dec.Metadata()
	require.NoError(t, err)
	payload, keys := blobFields(t, md)

	// Each REGISTER from a new process of the decode rank (a new epoch):
	// a process that registered one blob may not register another (it is
	// refused before its metadata is loaded), and each mutated blob must
	// reach the engine's checks.
	acks := make(chan *wire.RegisterAck, 16)
	var challenges uint64 // the prefill's challenges seen so far
	challenged := 0       // tries loaded and challenged, never answered
	to := wire.Peer{Endpoint: p.Endpoint()}
	epoch := control.NewEpoch()
	register := func(agentMD []byte) *wire.RegisterAck {
		t.Helper()
		epoch += 2
		loop, err := control.NewLoop(control.LoopConfig{
			Identity: wire.From{Role: wire.RoleDecode, Instance: "md-fuzz-decode", Rank: 0, Epoch: epoch},
			Bind:     "tcp://127.0.0.1:*", Auth: testauth.Auth(),
			Handler: func(m wire.Message) {
				if a, ok := m.(*wire.RegisterAck); ok {
					acks <- a
				}
			}})
		require.NoError(t, err)
		defer loop.Close()
		reg := &wire.Register{Compat: p.cfg.Compat, Agent: "md-fuzz-decode", AgentMD: agentMD, TPSize: 1,
			KV: kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: proof}
		require.NoError(t, loop.Send(to, reg))
		// The blob loads (the path that aborted the rank) when its agent is
		// challenged: the REGISTER is answered then if the blob is refused;
		// if it loads, the challenge reaches the decode agent — echoed
		// here, then the proof read and the answer — or, where the mutated
		// address reaches no agent, nobody: the REGISTER stays unanswered
		// (the rank alive, the blob loaded but unused) and the try counts
		// as challenged.
		// A REGISTER left for its sender to repeat (the previous try's
		// check still running, on a loaded machine) is repeated every
		// second, as a decode rank's is.
		deadline := time.After(30 * time.Second)
		poll, repeat := time.NewTicker(5*time.Millisecond), time.NewTicker(time.Second)
		defer poll.Stop()
		defer repeat.Stop()
		var silent time.Time
		for {
			select {
			case a := <-acks:
				return a
			case <-deadline:
				t.Fatal("no REGISTER_ACK within 30 s: the prefill rank stopped answering")
				return nil
			case <-repeat.C:
				require.NoError(t, loop.Send(to, reg))
				continue
			case <-poll.C:
			}
			ns, _ := dec.Notifs()
			for _, n := range ns {
				if x, ok := core.ParseChallenge(string(n.Msg)); ok && x.For == "decode/md-fuzz-decode/0" {
					reg.Echo = x.Nonce
					require.NoError(t, loop.Send(to, reg))
					silent = time.Time{}
				}
			}
			var st core.CoreStats
			p.read(func(c *core.Core) { st = c.Stats() })
			switch {
			case len(reg.Echo) > 0 || st.Challenges == challenges:
			case silent.IsZero():
				silent = time.Now()
			case time.Since(silent) > 200*time.Millisecond:
				challenged++
				challenges = st.Challenges
				return nil
			}
			if len(reg.Echo) > 0 {
				challenges = st.Challenges
			}
		}
	}
	a := register(md)
	require.NotNil(t, a, "genuine metadata: no REGISTER_ACK")
	require.True(t, a.OK, "genuine metadata refused: %s", a.Reason)

	const tries = 400
	r := rand.New(rand.NewPCG(23, 4))
	refused, accepted := 0, 0
	for i := 0; i < tries; i++ {
		m := append([]byte(nil), md...)
		span := payload
		if len(keys) > 0 && r.IntN(3) == 0 {
			span = keys[r.IntN(len(keys))]
		}
		lo, hi := span[0], span[1]
		if span == payload {
			lo++ // the address's header byte stays
		}
		switch r.IntN(4) {
		case 0, 1: // bit flips
			for k := 0; k <= r.IntN(3); k++ {
				m[lo+r.IntN(hi-lo)] ^= 1 << r.IntN(8)
			}
		case 2: // a byte set to a length-like or flag-like value
			m[lo+r.IntN(hi-lo)] = []byte{0, 1, 0x3f, 0x7f, 0x80, 0xc0, 0xff}[r.IntN(7)]
		default: // a field overwritten with random bytes
			p := lo + r.IntN(hi-lo)
			for q := p; q < min(hi, p+1+r.IntN(8)); q++ {
				m[q] = byte(r.Uint32())
			}
		}
		a := register(m)
		if a == nil {
			continue // challenged: its agent unreachable
		}
		if a.OK {
			accepted++
			continue
		}
		refused++
		require.True(t, strings.Contains(a.Reason, "agent metadata") || strings.Contains(a.Reason, "descriptor lists") || strings.Contains(a.Reason, "not_owner"),
			"REGISTER %d refused for a reason not naming the metadata: %s", i, a.Reason)
	}
	got := p.agent.MetadataRefused()
	require.NotZero(t, got, "the agent counted no refused blobs")
	require.LessOrEqual(t, int(got), refused, "the agent counted more refused blobs than the REGISTER_ACKs refusals")
	t.Logf("%d mutated REGISTERs through the control plane: %d refused (%d counted as bad metadata), %d accepted, %d loaded and challenged but unreachable",
		tries, refused, p.agent.MetadataRefused(), accepted, challenged)
	require.GreaterOrEqual(t, refused+challenged, tries/2, "only %d of %d refused: the mutations are not reaching the checks", refused, tries)
	// The rank is alive and registers the genuine metadata again.
	a = register(md)
	require.NotNil(t, a, "genuine metadata after the mutations: no REGISTER_ACK")
	require.True(t, a.OK, "genuine metadata refused after the mutations: %+v", a)
}

// blobFields finds, in a kvbridge metadata blob (internal/nixl/metadata.go's format:
// "KVBN" version engine agent library nregions regions payload), the
// spans of the UCX worker address and of each region's key.
func blobFields(t *testing.T, b []byte) (payload [2]int, keys [][2]int) {
	t.Helper()
	off := 5
	str := func() [2]int {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		s := [2]int{off + 4, off + 4 + n}
		off += 4 + n
		return s
	}
	require.Equal(t, "KVBN", string(b[:4]), "blob %x... is not a version 2 kvbridge blob", b[:5])
	require.EqualValues(t, 2, b[4], "blob %x... is not a version 2 kvbridge blob", b[:5])
	str()
	str()
	str()
	n := int(binary.LittleEndian.Uint32(b[off:]))
	off += 4
	for i := 0; i < n; i++ {
		off += 1 + 24
		if k := str(); k[1] > k[0] {
			keys = append(keys, k)
		}
	}
	payload = str()
	require.Equal(t, len(b), payload[1], "blob of %d bytes: payload end", len(b))
	return payload, keys
}
