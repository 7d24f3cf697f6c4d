package e2e

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
)

// proofValue is a region's ownership proof value as PROTOCOL.md "Memory
// proven to its owner" defines it: HMAC-SHA256(seed, "kvbridge ownership
// proof v1", 0, len(owner), owner, list, then as little-endian uint64 the
// index, the memory kind, the device, the address and the length).
func proofValue(seed []byte, owner string, list byte, index int, d nixl.Desc) []byte {
	h := hmac.New(sha256.New, seed)
	h.Write([]byte("kvbridge ownership proof v1"))
	h.Write([]byte{0, byte(len(owner))})
	h.Write([]byte(owner))
	var b [1 + 8*5]byte
	b[0] = list
	binary.LittleEndian.PutUint64(b[1:], uint64(index))
	binary.LittleEndian.PutUint64(b[9:], uint64(nixl.DRAM))
	binary.LittleEndian.PutUint64(b[17:], 0)
	binary.LittleEndian.PutUint64(b[25:], uint64(d.Addr))
	binary.LittleEndian.PutUint64(b[33:], d.Len)
	h.Write(b[:])
	return h.Sum(nil)
}

// TestRenewingDecodeCannotPinPages: issue 49's renewing decode rank, on
// real processes. A decode rank with its own certificate registers as a
// real one does — its own agent and memory, its proof slots written, the
// agent challenge echoed —, asks a prefill process for a pulled room, and
// then renews the lease a third of the lease apart, forever, reading
// nothing. The prefill process's room fails and its published pages are
// released (RELEASED, forced) within the bound docs/PULL.md states — the
// last publish + 2 × StallTimeout + QuarantineTimeout — while the RENEWs
// keep coming, each one after the room's end refused and counted; the
// prefill process stays alive and answers.
func TestRenewingDecodeCannotPinPages(t *testing.T) {
	t.Parallel() // its own processes and ports
	const stall, quarantine, lease = 2 * time.Second, 3 * time.Second, time.Second
	bound := 2*stall + quarantine
	attackerID := wire.From{Role: wire.RoleDecode, Instance: "renewer", Rank: 0}
	_, envs, ids := identityFiles(t, wire.From{Role: wire.RolePrefill, Instance: "proc", Rank: 0}, attackerID)
	boot := startBoot(t)
	prefill := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot,
		"KVBRIDGE_E2E_PULL=1", "KVBRIDGE_E2E_STALL=" + stall.String(), "KVBRIDGE_E2E_QUARANTINE=" + quarantine.String(),
		"KVBRIDGE_E2E_PULL_LEASE=" + lease.String()}, envs[0]...)...)

	// The renewer's agent and memory: the layout's regions, each followed
	// by its proof slot holding its value for the renewer's identity.
	cfg := engines["ucx-tcp"]
	cfg.Name = "renewer-decode-0"
	agent, err := nixl.Open(cfg)
	require.NoError(t, err)
	defer agent.Close()
	seed := make([]byte, 32)
	_, err = rand.Read(seed)
	require.NoError(t, err)
	own := layout()
	region := func(list byte, index int, n uint64) nixl.Desc {
		_, buf, err := agent.Alloc(n + transfer.ProofBytes)
		require.NoError(t, err)
		d := nixl.BytesDesc(buf[:n])
		copy(buf[n:], proofValue(seed, attackerID.Peer(), list, index, d))
		return d
	}
	for i := range own.Regions {
		own.Regions[i] = region('k', i, own.Regions[i].Len)
	}
	own.Aux = region('a', 0, own.Aux.Len)
	for i := range own.State {
		own.State[i].Desc = region('s', i, own.State[i].Len)
	}
	md, err := agent.Metadata()
	require.NoError(t, err)
	kv, aux, state := registerRegions(own)

	var mu sync.Mutex
	var lastPages time.Time // the last PAGES (publish) heard
	publishes := 0
	acks := make(chan *wire.RegisterAck, 4)
	loop, err := control.NewLoop(control.LoopConfig{Identity: attackerID, Bind: "tcp://127.0.0.1:*",
		Auth: testauth.Auth(), RankIdentity: ids[1],
		Handler: func(m wire.Message) {
			switch m := m.(type) {
			case *wire.RegisterAck:
				acks <- m
			case *wire.Pages:
				mu.Lock()
				lastPages, publishes = time.Now(), publishes+1
				mu.Unlock()
			}
		}})
	require.NoError(t, err)
	defer loop.Close()
	to := peerOf(t, prefill, string(ids[0].Cert.Raw()))

	// Register as a decode rank does: REGISTER (pull), the challenge
	// echoed at once, repeated every second until an answer.
	reg := &wire.Register{Compat: "v1:test-layout", Agent: cfg.Name, AgentMD: md, TPSize: 1, KV: kv, Aux: aux, State: state, Proof: seed, Pull: true}
	send := func(m wire.Message) { require.NoError(t, loop.Send(to, m)) }
	send(reg)
	poll, repeat, deadline := time.NewTicker(10*time.Millisecond), time.NewTicker(time.Second), time.After(30*time.Second)
	var ack *wire.RegisterAck
	for ack == nil {
		select {
		case ack = <-acks:
		case <-deadline:
			t.Fatal("no REGISTER_ACK within 30 s")
		case <-repeat.C:
			send(reg)
		case <-poll.C:
			ns, _ := agent.Notifs()
			for _, n := range ns {
				if x, ok := core.ParseChallenge(string(n.Msg)); ok && x.For == attackerID.Peer() {
					reg.Echo = append(reg.Echo, x.Nonce...)
					send(reg)
				}
			}
		}
	}
	poll.Stop()
	repeat.Stop()
	require.True(t, ack.OK, "the renewer's genuine registration refused: %s", ack.Reason)
	require.NotNil(t, ack.Pull, "no pull offer")

	// A pulled room, then RENEWs forever; nothing is read.
	pp := newPagePool(pages)
	src := pp.Get(16)
	dst := make([]uint32, len(src))
	for i := range dst {
		dst[i] = uint32(i)
	}
	const room = 7
	start := time.Now()
	send(&wire.Request{Room: room, DstPages: dst, AuxIndex: -1, Required: 1, Pull: true, At: uint64(time.Now().UnixNano())})
	prefill.do(fmt.Sprintf("SEND %d %s 4", room, csv(src)))
	stop, renewed, each := make(chan struct{}), make(chan int), make(chan struct{}, 1024)
	go func() {
		n := 0
		tick := time.NewTicker(lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				renewed <- n
				return
			case <-tick.C:
				if loop.Send(to, &wire.Renew{Room: room, At: uint64(time.Now().UnixNano())}) == nil {
					n++
					select {
					case each <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	refusedBefore := procCounter(t, prefill, "kvbridge_pull_messages_refused_total")
	done := prefill.expect(t, fmt.Sprintf("DONE %d", room))
	assert.Contains(t, done, "Failed", "the renewed room, never read")
	released := prefill.expect(t, fmt.Sprintf("RELEASED %d", room))
	at := time.Now()
	mu.Lock()
	last, published := lastPages, publishes
	mu.Unlock()
	require.Positive(t, published, "no PAGES published to the renewer")
	held := at.Sub(last)
	t.Logf("room %d: %d PAGES, the last %v after the REQUEST; %s; released %v after the last publish (bound %v: 2 × stall + quarantine); %s",
		room, published, last.Sub(start).Round(time.Millisecond), done, held.Round(time.Millisecond), bound, released)
	forced, err := strconv.Atoi(strings.Fields(released)[2])
	require.NoError(t, err)
	assert.Equal(t, 1, forced, "the release forced (no drained READ_DONE came): %s", released)
	// The bound, with room for a loaded machine's scheduling (the sweep
	// runs every 50 ms): a release that waited for the RENEWs to stop
	// would never come while they go on.
	assert.Less(t, held, bound+5*time.Second, "pages held %v past the last publish, bound %v", held, bound)

	// Still renewing after the release: refused and counted; the prefill
	// rank answers.
	for len(each) > 0 {
		<-each // (those sent before the release)
	}
	for range 3 {
		<-each
	}
	refused, forcedNow := procCounter(t, prefill, "kvbridge_pull_messages_refused_total"), procCounter(t, prefill, "kvbridge_quarantine_expired_total")
	close(stop)
	n := <-renewed
	assert.Greater(t, refused, refusedBefore, "RENEWs after the room's end not refused")
	assert.GreaterOrEqual(t, forcedNow, uint64(1))
	t.Logf("%d RENEWs sent; %d refused and counted since the room's start", n, refused-refusedBefore)
}
