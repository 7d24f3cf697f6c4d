package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// The hostile mode (-hostile): while the real workload runs, an attacker in
// this process sends every class of bad input listed below, at both
// ranks, round after round: unauthenticated messages (garbage frames, valid
// messages without a tag or with another secret, PINGs from forged
// endpoints, a REGISTER with a garbage agent blob), authenticated hostile
// messages (an insider or a broken peer: REGISTERs whose UCX worker address
// is garbage, reasons and instance names of 1 MiB, arrays declaring millions
// of elements, early ABORTs under thousands of identities, ABORTs sent to
// the decode rank for the workload's own rooms), and hostile HTTP (writes
// without or with a wrong token, a live rank's record claimed by another
// endpoint, trailing garbage, 10 MB bodies, tokens near 2^63). At the end
// the real rooms must have succeeded byte-exact (or been aborted as asked),
// both ranks must be alive, every refusal counted, and every bounded table
// within its bound.

// attackRoomBase keeps the attacker's early ABORTs off the workload's rooms
// (an authenticated peer may abort any room; that is the protocol).
const attackRoomBase = 1 << 40

type attacker struct {
	prefill, decode *proc
	minRounds       int // rounds run even if the workload ends first
	model           kvmodel.Model
	layout          transfer.PageLayout
	pages           int
	ctx             *zmq.Context
	pull            *zmq.Socket // where replies to the insider's messages go
	self            string

	mu     sync.Mutex
	rounds int
	sent   map[string]int // messages or requests per class
	seq    uint64         // the attacker process's message numbers (under mu)
	// Under per-rank identity the insider holds the keys of three decode
	// ranks of its own (instance hostile-register, ranks 0–2): it speaks as
	// them, addressed to the prefill rank's certificate from its bootstrap
	// record. It knows no certificate of the decode rank (decode ranks
	// publish none), so what it sends there carries the secret alone.
	ids         [3]*ident.RankIdentity
	prefillCert []byte
	library     string   // the local UCX release, as a real blob names it
	realAddr    []byte   // a real worker address of this machine's UCX (a local agent's)
	acksBad     int      // REGISTER_ACK ok=false received
	httpBad     []string // HTTP answers that were not the expected refusal
	zmqFails    int
}

func newAttacker(prefill, decode *proc, model kvmodel.Model, layout transfer.PageLayout, pages, minRounds int) (*attacker, error) {
	a := &attacker{prefill: prefill, decode: decode, model: model, layout: layout, pages: pages, sent: map[string]int{}, minRounds: minRounds}
	var err error
	if a.ctx, err = zmq.NewContext(); err != nil {
		return nil, err
	}
	if a.pull, err = a.ctx.NewSocket(zmq.PULL); err != nil {
		return nil, err
	}
	a.pull.SetLinger(0)
	if err := a.pull.Bind("tcp://127.0.0.1:*"); err != nil {
		return nil, err
	}
	a.self, _ = a.pull.GetLastEndpoint()
	a.library, a.realAddr = localAgent()
	if ca != nil {
		for r := range a.ids {
			id, err := ca.Issue(wire.RoleDecode, "hostile-register", r, time.Now().Add(time.Hour))
			if err != nil {
				return nil, err
			}
			a.ids[r] = id.(*ident.RankIdentity) // the forger seals as internal/control does

		}
		cl := discovery.NewClient(prefill.boot)
		info, err := cl.Rank(context.Background(), 0, 0, 0)
		if err != nil {
			return nil, fmt.Errorf("hostile: the prefill rank's record: %w", err)
		}
		if a.prefillCert = []byte(info.CertBytes()); len(a.prefillCert) == 0 {
			return nil, errors.New("hostile: the prefill rank's record carries no identity certificate")
		}
	}
	return a, nil
}

func (a *attacker) close() {
	a.pull.Close()
	a.ctx.Term()
}

// run attacks until ctx ends and at least minRounds rounds ran.
func (a *attacker) run(ctx context.Context) {
	rctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // replies to the insider's REGISTERs
		defer wg.Done()
		poller := zmq.NewPoller()
		poller.Add(a.pull, zmq.POLLIN)
		for rctx.Err() == nil {
			if p, _ := poller.Poll(50 * time.Millisecond); len(p) == 0 {
				continue
			}
			frames, err := a.pull.RecvMessageBytes(0)
			if err != nil {
				continue
			}
			// Only the REGISTER_ACKs are counted: under per-rank identity they
			// are sealed to the rank they answer (one of the insider's three).
			if len(frames) == 4 {
				if a.ids[0] != nil {
					for _, id := range a.ids {
						if opened, _, why := control.OpenAs(auth, id, cloneFrames(frames), time.Now()); why == "" {
							frames = opened
							break
						}
					}
				}
				if m, err := wire.Decode(frames[:3]); err == nil {
					if ack, ok := m.(*wire.RegisterAck); ok && !ack.OK {
						a.mu.Lock()
						a.acksBad++
						a.mu.Unlock()
					}
				}
			}
		}
	}()
	push := map[string]*zmq.Socket{}
	for _, p := range []*proc{a.prefill, a.decode} {
		s, err := a.ctx.NewSocket(zmq.PUSH)
		if err != nil {
			panic(err)
		}
		s.SetLinger(0)
		s.SetSndhwm(100000)
		s.Connect(p.endpoint)
		push[p.name] = s
	}
	defer func() {
		for _, s := range push {
			s.Close()
		}
	}()
	for round := 0; ctx.Err() == nil || round < a.minRounds; round++ {
		a.round(round, push)
		a.mu.Lock()
		a.rounds++
		a.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Replies to the last REGISTERs: a short grace, bounded.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		n := a.acksBad
		a.mu.Unlock()
		if n >= a.rounds*2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	wg.Wait()
}

func (a *attacker) send(s *zmq.Socket, class string, frames [][]byte) {
	if _, err := s.SendMessageDontwait(frames); err != nil {
		a.mu.Lock()
		a.zmqFails++
		a.mu.Unlock()
		return
	}
	a.mu.Lock()
	a.sent[class]++
	a.mu.Unlock()
}

// cloneFrames copies frames (a sealed body is opened in place).
func cloneFrames(frames [][]byte) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = append([]byte(nil), f...)
	}
	return out
}

func encode(m wire.Message) [][]byte {
	f, err := wire.Encode(m)
	if err != nil {
		panic(err)
	}
	return f
}

// seal tags frames addressed to the process p as an insider would: with
// the secret, and under per-rank identity, to the prefill rank, as the
// decode rank hostile-register/rank (whose from the body may or may not
// claim: claiming another is refused as forged).
func (a *attacker) seal(p *proc, rank int, frames [][]byte) [][]byte {
	a.mu.Lock()
	a.seq++
	env := control.Envelope{Sent: time.Now(), Seq: a.seq, To: wire.From{Epoch: p.epoch}}
	a.mu.Unlock()
	var id *ident.RankIdentity
	if a.ids[0] != nil && p == a.prefill {
		id = a.ids[rank%len(a.ids)]
	}
	out, err := control.SealAs(auth, id, a.prefillCert, frames, env)
	if err != nil {
		panic(err)
	}
	return out
}

func (a *attacker) sealed(p *proc, m wire.Message) [][]byte { return a.seal(p, 0, encode(m)) }

// localAgent returns the engine library a real ucx blob of this machine
// names (internal/nixl/metadata.go: "ucx/<release>") and a real worker address,
// read from a short-lived local agent's blob (no regions), so the
// insider's REGISTERs reach the address check with addresses UCX wrote.
func localAgent() (library string, addr []byte) {
	cfg := nixl.Config{Name: "hostile-probe", Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	cfg.FromEnv() // the libucp KVBRIDGE_UCX_LIB names, as the ranks load
	ag, err := nixl.Open(cfg)
	if err != nil {
		return "ucx/unknown", nil
	}
	defer ag.Close()
	md, err := ag.Metadata()
	if err != nil || len(md) < 5 {
		return "ucx/unknown", nil
	}
	off := 5
	str := func() []byte {
		if off+4 > len(md) {
			return nil
		}
		n := int(binary.LittleEndian.Uint32(md[off:]))
		if off+4+n > len(md) {
			return nil
		}
		v := md[off+4 : off+4+n]
		off += 4 + n
		return v
	}
	str() // engine
	str() // agent
	library = string(str())
	if off+4 <= len(md) && binary.LittleEndian.Uint32(md[off:]) == 0 { // no regions
		off += 4
		addr = bytes.Clone(str())
	}
	return library, addr
}

// mutate returns a copy of addr with its header byte kept and a few of the
// other bytes changed (seeded).
func mutate(addr []byte, seed uint64) []byte {
	m := bytes.Clone(addr)
	x := seed*0x9e3779b97f4a7c15 + 1
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for n := 1 + next()%4; n > 0 && len(m) > 1; n-- {
		i := 1 + int(next()%uint64(len(m)-1))
		switch next() % 3 {
		case 0:
			m[i] ^= 1 << (next() % 8)
		case 1:
			m[i] = byte(next())
		default:
			m[i] = []byte{0, 0xff, 0x7f, 0x80}[next()%4]
		}
	}
	return m
}

// rawBody builds a message body by hand (for what Encode refuses to write).
func rawBody(pairs ...any) []byte {
	var b bytes.Buffer
	enc := msgpack.NewEncoder(&b)
	enc.EncodeMapLen(len(pairs) / 2)
	for i := 0; i < len(pairs); i += 2 {
		enc.EncodeString(pairs[i].(string))
		if raw, ok := pairs[i+1].(msgpack.RawMessage); ok {
			b.Write(raw)
			continue
		}
		enc.Encode(pairs[i+1])
	}
	return b.Bytes()
}

func (a *attacker) from(instance string, rank int) wire.From {
	return wire.From{Role: wire.RoleDecode, Instance: instance, Rank: rank, Endpoint: a.self, Epoch: 7}
}

func fromMap(f wire.From) map[string]any {
	return map[string]any{"role": f.Role, "instance": f.Instance, "rank": f.Rank, "endpoint": f.Endpoint, "epoch": f.Epoch}
}

// agentBlob is a well-formed kvbridge ucx metadata blob (internal/nixl/metadata.go's
// format) around a worker address.
func (a *attacker) agentBlob(addr []byte) []byte {
	b := append([]byte("KVBN"), 2)
	put := func(v []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	put([]byte(nixl.EngineUCX))
	put([]byte("hostile-agent"))
	put([]byte(a.library))
	b = binary.LittleEndian.AppendUint32(b, 0)
	put(addr)
	return b
}

// register is a REGISTER that passes the compat, topology and layout
// checks (a decode rank at TP 1), so its agent blob reaches the engine.
func (a *attacker) register(md []byte, rank int) *wire.Register {
	lay, err := a.model.RankLayout(nixl.DRAM, a.layout, transfer.Parallel{}, a.pages, 4096)
	if err != nil {
		panic(err)
	}
	tm := a.model.Mapping(a.layout)
	var kv []wire.Region
	for i, r := range lay.Regions {
		kv = append(kv, wire.Region{Addr: uint64(0x100000000 + i*int(r.Len)), Len: r.Len, ItemLen: lay.PageBytes, Mem: wire.MemDRAM})
	}
	aux := []wire.Region{{Addr: 0x7000000000, Len: lay.Aux.Len, ItemLen: lay.AuxItemBytes, Mem: wire.MemDRAM}}
	return &wire.Register{From: a.from("hostile-register", rank), Compat: a.model.Compat(), Agent: "hostile-agent",
		AgentMD: md, TPSize: 1, KV: kv, Aux: aux, State: []wire.Region{},
		Topo: &wire.Topo{PPSize: 1, DPSize: 1, Layers: tm.Layers, KVHeads: tm.KVHeads, HeadBytes: tm.HeadBytes,
			PageTokens: tm.PageTokens, MLA: tm.MLA, PageLayout: tm.Layout.String()}}
}

func (a *attacker) round(round int, push map[string]*zmq.Socket) {
	other, _ := bootstrap.NewAuth([]byte("not this deployment's secret!!"))
	garbageAddr := func(k int) []byte {
		switch k % 3 {
		case 0:
			return nil
		case 1:
			r := make([]byte, 300)
			for i := range r {
				r[i] = byte(i*131 + round)
			}
			r[0] = 0xf7
			return r
		default:
			return bytes.Repeat([]byte{0xff}, 64<<10)
		}
	}
	mib := strings.Repeat("x", 1<<20)
	for _, p := range []*proc{a.prefill, a.decode} {
		name := p.name
		s := push[name]
		// Unauthenticated.
		a.send(s, "garbage frames", [][]byte{[]byte("KVB1")})
		a.send(s, "garbage frames", [][]byte{[]byte("KVB1"), []byte("ABORT"), {0xc1, 0xff}})
		a.send(s, "garbage frames", [][]byte{[]byte("HTTP"), []byte("GET / HTTP/1.1"), nil, nil, nil})
		a.send(s, "no tag", encode(&wire.Abort{From: a.from("untagged", 0), Room: 1, Reason: "x"}))
		a.send(s, "no tag", encode(&wire.Request{From: a.from("untagged", 0), Room: 1, DstPages: []uint32{1}, AuxIndex: -1, Required: 1}))
		a.send(s, "other secret", control.Seal(other, encode(&wire.Abort{From: a.from("other-secret", 0), Room: 1}),
			control.Envelope{Sent: time.Now(), Seq: 1, To: wire.From{Epoch: p.epoch}}))
		for i := 0; i < 100; i++ {
			f := wire.From{Role: wire.RoleDecode, Instance: "forged", Rank: i,
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 20000+(round*100+i)%40000), Epoch: uint64(round)}
			a.send(s, "forged PINGs", encode(&wire.Ping{From: f, Seq: 1}))
		}
		a.send(s, "untagged REGISTER, garbage blob", encode(a.register(a.agentBlob(garbageAddr(round)), 0)))

		// Authenticated (an insider, or a broken peer).
		reg := a.register(a.agentBlob(garbageAddr(round)), round%3)
		var id *ident.RankIdentity
		if a.ids[0] != nil && p == a.prefill {
			id = a.ids[round%3]
		}
		sealedMD, err := control.SealAgentMD(auth, id, a.prefillCert, reg.AgentMD, reg.From, wire.From{Epoch: p.epoch})
		if err != nil {
			panic(err)
		}
		reg.AgentMD = sealedMD
		a.send(s, "REGISTER, garbage UCX address", a.seal(p, round%3, encode(reg)))
		// A real worker address of this machine's UCX, its header kept and
		// the rest mutated (one such REGISTER once aborted a prefill rank
		// in ucp_ep_create).
		for k := 0; k < 10 && a.realAddr != nil; k++ {
			reg := a.register(a.agentBlob(mutate(a.realAddr, uint64(round*10+k))), k%3)
			if a.ids[0] != nil && p == a.prefill {
				id = a.ids[k%3]
			}
			if reg.AgentMD, err = control.SealAgentMD(auth, id, a.prefillCert, reg.AgentMD, reg.From, wire.From{Epoch: p.epoch}); err != nil {
				panic(err)
			}
			a.send(s, "REGISTER, mutated real UCX address", a.seal(p, k%3, encode(reg)))
		}
		a.send(s, "1 MiB reason", a.seal(p, 0, [][]byte{[]byte(wire.Magic), []byte("ABORT"),
			rawBody("from", fromMap(a.from("long-reason", 0)), "room", uint64(attackRoomBase+round), "reason", mib)}))
		long := a.from("x", 0)
		long.Instance = mib
		a.send(s, "1 MiB instance", a.seal(p, 0, [][]byte{[]byte(wire.Magic), []byte("PING"),
			rawBody("from", fromMap(long), "seq", 1)}))
		n := 2 << 20
		arr := append([]byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, bytes.Repeat([]byte{0x80}, n)...)
		a.send(s, "2M-element array", a.seal(p, 0, [][]byte{[]byte(wire.Magic), []byte("REGISTER"),
			rawBody("from", fromMap(a.from("huge-array", 0)), "compat", "c", "agent", "a", "agent_md", []byte{},
				"tp_size", 1, "tp_rank", 0, "kv", msgpack.RawMessage(arr), "aux", []any{}, "state", []any{})}))
		for i := 0; i < 200; i++ {
			a.send(s, "early ABORTs, many identities", a.sealed(p, &wire.Abort{From: a.from("abort-identity", round*200+i),
				Room: attackRoomBase + uint64(round*200+i), Reason: strings.Repeat("r", 1000)}))
		}
	}
	// ABORTs at the decode rank for the workload's own rooms: ABORT goes
	// decode → prefill only, so a decode rank must ignore them.
	for room := uint64(1); room <= 20; room++ {
		a.send(push["decode"], "ABORT to decode", a.sealed(a.decode, &wire.Abort{From: a.from("stray", 0), Room: room + uint64(round), Reason: "stray"}))
	}
	if round%10 == 0 {
		a.http(round)
	}
}

// http sends the hostile HTTP requests; each must get its refusal.
func (a *attacker) http(round int) {
	rec := fmt.Sprintf(`{"instance":"prefill","dp_rank":0,"dp_size":1,"tp_rank":0,"tp_size":1,"pp_rank":0,"pp_size":1,`+
		`"endpoint":"tcp://127.0.0.1:%d","page_size":%d,"dtype":"%dB","compat":%q}`, 1+round%60000, a.model.PageTokens, a.model.DTypeBytes, a.model.Compat())
	for _, c := range []struct {
		base                    string
		method, path, tok, body string
		want                    int
	}{
		{a.prefill.boot, "PUT", "/v1/ranks", "", rec, 401},
		{a.prefill.boot, "PUT", "/v1/ranks", "forged-token", rec, 401},
		{a.prefill.boot, "PUT", "/v1/ranks", token, rec, 409}, // the live rank's record, claimed by another endpoint
		{a.prefill.boot, "PUT", "/v1/ranks", token, rec + "garbage", 400},
		{a.prefill.boot, "PUT", "/v1/ranks", token, `{"instance":"` + strings.Repeat("x", 10<<20) + `"}`, 413},
		{a.prefill.boot, "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=tcp://127.0.0.1:1", token, "", 409},
	} {
		a.expect(c.base, c.method, c.path, c.tok, c.body, c.want)
	}
	for _, p := range []*proc{a.prefill, a.decode} {
		a.expect(p.http, "POST", "/v1/room", "", `{"room":1,"tokens":16}`, 401)
		a.expect(p.http, "POST", "/v1/room", token, `{"room":1,"tokens":9223372036854775800}`, 400)
		a.expect(p.http, "POST", "/v1/room", token, `{"room":1,"tokens":16,"timeout_ms":9223372036854775}`, 400)
		a.expect(p.http, "POST", "/v1/room", token, `{"room":1,"tokens":16,"abort_at":"`+strings.Repeat("x", 1<<20)+`"}`, 413)
	}
}

func (a *attacker) expect(base, method, path, tok, body string, want int) {
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	got := "error " + fmt.Sprint(err)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = strconv.Itoa(resp.StatusCode)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent["hostile HTTP"]++
	if got != strconv.Itoa(want) {
		a.httpBad = append(a.httpBad, fmt.Sprintf("%s %s%s: %s, want %d", method, base, path, got, want))
	}
}

var sampleLine = regexp.MustCompile(`^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$`)

// scrape reads a rank's metrics: name → label set → value.
func scrape(url string) (map[string]map[string]float64, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sampleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		if out[m[1]] == nil {
			out[m[1]] = map[string]float64{}
		}
		out[m[1]][m[2]] = v
	}
	return out, sc.Err()
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// rss is a process's resident memory in MiB (Linux), or −1.
func rss(p *proc) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return -1
}

// report prints what was sent and checks the ranks; it returns problems.
func (a *attacker) report(rssStart map[string]float64) []string {
	var problems []string
	a.mu.Lock()
	fmt.Printf("\nhostile input: %d rounds\n", a.rounds)
	total := 0
	for class, n := range a.sent {
		total += n
		fmt.Printf("  %-34s %d\n", class, n)
	}
	if a.zmqFails > 0 {
		fmt.Printf("  %-34s %d (the attacker's own queue was full)\n", "not sent", a.zmqFails)
	}
	fmt.Printf("  %-34s %d\n", "REGISTER_ACK ok=false received", a.acksBad)
	problems = append(problems, a.httpBad...)
	if a.rounds == 0 || total == 0 {
		problems = append(problems, "the attacker sent nothing")
	}
	if a.acksBad == 0 {
		problems = append(problems, "no REGISTER with a garbage UCX address was refused with REGISTER_ACK ok=false")
	}
	a.mu.Unlock()

	const maxSockets, maxTombstones = 1024, 1 << 20 // the defaults
	for _, p := range []*proc{a.prefill, a.decode} {
		if p.cmd.ProcessState != nil {
			problems = append(problems, p.name+" exited: "+p.cmd.ProcessState.String())
			continue
		}
		m, err := scrape(p.http)
		if err != nil {
			problems = append(problems, p.name+": metrics: "+err.Error())
			continue
		}
		unauth, malformed := sum(m["kvbridge_unauthenticated_messages_total"]), sum(m["kvbridge_malformed_messages_total"])
		sockets, tombs := sum(m["kvbridge_control_sockets"]), m["kvbridge_core_entries"]
		fmt.Printf("  %-8s refused unauthenticated %.0f, malformed %.0f, sockets %.0f, tombstones %.0f, RSS %.0f MiB at a quarter of the workload, %.0f at the end\n",
			p.name, unauth, malformed, sockets, sumLabel(tombs, "tombstones"), rssStart[p.name], rss(p))
		switch {
		case unauth == 0:
			problems = append(problems, p.name+": no unauthenticated message counted")
		case malformed == 0 && (a.ids[0] == nil || p == a.prefill):
			// Under per-rank identity the insider holds no key the decode
			// rank accepts (a decode rank's own role): nothing it sends
			// there is authentic, so nothing there is decoded.
			problems = append(problems, p.name+": no malformed message counted")
		case sockets > maxSockets:
			problems = append(problems, fmt.Sprintf("%s: %.0f sockets open, bound %d", p.name, sockets, maxSockets))
		case sumLabel(tombs, "tombstones") > maxTombstones:
			problems = append(problems, fmt.Sprintf("%s: %.0f tombstones, bound %d", p.name, sumLabel(tombs, "tombstones"), maxTombstones))
		}
	}
	// The bootstrap record still names the real prefill rank.
	if resp, err := http.Get(a.prefill.boot + "/v1/ranks?dp=0&tp=0&pp=0"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), a.prefill.endpoint) {
			problems = append(problems, "the bootstrap record was replaced: "+string(b))
		}
	} else {
		problems = append(problems, "bootstrap: "+err.Error())
	}
	return problems
}

func sumLabel(m map[string]float64, table string) float64 {
	for k, v := range m {
		if strings.Contains(k, `table="`+table+`"`) {
			return v
		}
	}
	return 0
}
