package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/testnet"
	"github.com/kvbridge/kvbridge/internal/wire"
	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/require"
)

// Issue 23 with real processes: a prefill and a decode rank process under
// per-rank identity; the prefill process's control tap gives the test the
// decode rank's messages as they came off the wire, which it replays and
// re-presents — an outsider on the path, a holder of the shared secret, a
// holder of another rank's key.

// captured asks a rank process for the first message of type typ it
// received, as it came off the wire (its control tap): what an outsider on
// the path captures.
func (p *rankProc) captured(t *testing.T, typ string) [][]byte {
	t.Helper()
	p.do("CAPTURE " + typ)
	var f [][]byte
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(p.expect(t, "CAPTURED "), "CAPTURED ")), &f), "no %s captured", typ)
	require.Len(t, f, 4, "no %s captured: frames", typ)
	return f
}

// sendRaw sends frames byte for byte to a rank process on a connection
// of its own, then a marker, and returns the rank's counters once the
// marker came in: every frame before it has been handled.
func sendRaw(t *testing.T, to *rankProc, endpoint string, frames ...[][]byte) control.Stats {
	t.Helper()
	ctx, _ := zmq.NewContext()
	s, _ := ctx.NewSocket(zmq.PUSH)
	s.SetLinger(5 * time.Second)
	require.NoError(t, s.Connect(endpoint))
	nonce := fmt.Sprint(time.Now().UnixNano())
	for _, f := range append(frames, [][]byte{[]byte("MARK"), []byte(nonce)}) {
		_, err := s.SendMessage(f)
		require.NoError(t, err)
	}
	s.Close() // lingers until sent
	ctx.Term()
	to.do("MARKED " + nonce)
	to.expect(t, "MARKED "+nonce)
	return to.stats(t)
}

// stats asks a rank process for its control-plane counters.
func (p *rankProc) stats(t *testing.T) control.Stats {
	t.Helper()
	p.do("STATS 0")
	var s control.Stats
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(p.expect(t, "STATS "), "STATS ")), &s))
	return s
}

// identityFiles issues a certificate for each identity and writes the
// files a rank process reads; it returns the CA and the env of each.
func identityFiles(t *testing.T, ids ...wire.From) (*ident.CA, [][]string, []*ident.RankIdentity) {
	t.Helper()
	ca, err := ident.NewCA()
	require.NoError(t, err)
	dir := t.TempDir()
	caf := filepath.Join(dir, "ca")
	require.NoError(t, os.WriteFile(caf, ca.Marshal(false), 0o644))
	var envs [][]string
	var out []*ident.RankIdentity
	for i, f := range ids {
		id, err := ca.Issue(f.Role, f.Instance, f.Rank, time.Now().Add(time.Hour))
		require.NoError(t, err)
		p := filepath.Join(dir, fmt.Sprint("id", i))
		require.NoError(t, os.WriteFile(p, id.Marshal(), 0o600))
		envs = append(envs, []string{"KVBRIDGE_CA_FILE" + "=" + caf, "KVBRIDGE_IDENTITY_FILE" + "=" + p})
		out = append(out, id)
	}
	return ca, envs, out
}

func pdRoom(t *testing.T, prefill, decode *rankProc, id uint64, pp, dp *kvmodel.Pages) {
	t.Helper()
	pdRoomOf(t, prefill, decode, id, 64, 16, pp, dp)
}

// pdRoomTry runs a room that may fail: "" on success, else the decode
// rank's DONE line (the prefill rank's is read either way).
func pdRoomTry(t *testing.T, prefill, decode *rankProc, id uint64, pp, dp *kvmodel.Pages) string {
	t.Helper()
	src, dst := pp.Get(64), dp.Get(64)
	defer pp.Put(src)
	defer dp.Put(dst)
	decode.do(fmt.Sprintf("RECV %d %s %s", id, csv(dst), csv(src)))
	prefill.do(fmt.Sprintf("SEND %d %s 16", id, csv(src)))
	got := decode.expect(t, "DONE")
	prefill.expect(t, "DONE")
	if got == fmt.Sprintf("DONE %d Success verified", id) {
		return ""
	}
	return got
}

// pdRoomOf runs one room of n pages in chunks of chunk pages between two
// rank processes and checks both ends succeeded, the decode one verified.
func pdRoomOf(t *testing.T, prefill, decode *rankProc, id uint64, n, chunk int, pp, dp *kvmodel.Pages) {
	t.Helper()
	src, dst := pp.Get(n), dp.Get(n)
	defer pp.Put(src)
	defer dp.Put(dst)
	decode.do(fmt.Sprintf("RECV %d %s %s", id, csv(dst), csv(src)))
	prefill.do(fmt.Sprintf("SEND %d %s %d", id, csv(src), chunk))
	require.Equal(t, fmt.Sprintf("DONE %d Success verified", id), decode.expect(t, "DONE"), "decode")
	got := prefill.expect(t, "DONE")
	require.True(t, strings.HasPrefix(got, fmt.Sprintf("DONE %d Success", id)), "prefill: %s", got)
}

// TestCapturedMessagesReplayed (issue 23, 1 and 3): a decode rank's
// REGISTER, captured on the wire, carries its agent metadata only sealed;
// replayed byte for byte it is a duplicate to the process it was for, a
// message for another process to that rank restarted in place, and
// re-presented under another decode rank's identity it is refused — and
// the live rooms of the restarted processes succeed meanwhile.
func TestCapturedMessagesReplayed(t *testing.T) {
	t.Parallel() // its own processes and ports
	_, envs, ids := identityFiles(t,
		wire.From{Role: wire.RolePrefill, Instance: "proc"},
		wire.From{Role: wire.RoleDecode, Instance: "proc"},
		wire.From{Role: wire.RoleDecode, Instance: "proc", Rank: 1}) // the insider's
	boot := startBoot(t)
	port := freePort(t)
	pEnv := append([]string{"KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot,
		"KVBRIDGE_E2E_BIND=tcp://127.0.0.1:" + port}, envs[0]...)
	prefill := startChild(t, pEnv...)
	pEndpoint := strings.Fields(prefill.ready)[1]
	dEnv := append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}, envs[1]...)
	decode := startChild(t, dEnv...)
	pp, dp := newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, decode, 1, pp, dp)
	captured := prefill.captured(t, "REGISTER")
	// Under per-rank identity the body is sealed to the prefill rank
	// (PROTOCOL.md "Sealed bodies"): on the path — and to an insider with
	// a key of its own — nothing of it decodes, its agent metadata, proof
	// seed and regions included. (That the blob's own seal names its owner
	// when it is re-presented: control.TestAgentMetadataSealedToItsRecipient.)
	_, err := wire.Decode(captured[:3])
	require.Error(t, err, "the captured REGISTER decodes on the path: its body is not sealed")
	require.Equal(t, "KVA5", string(captured[3][:4]), "the captured REGISTER's envelope, want a sealed one") // PROTOCOL.md "Sealed bodies"

	// Replayed to the process it was for, while the pair works: a
	// duplicate; the next room succeeds.
	st := sendRaw(t, prefill, pEndpoint, captured)
	require.EqualValues(t, 1, st.Replayed[control.ReplayDuplicate], "the replayed REGISTER: replays %v, want 1 duplicate", st.Replayed)
	pdRoom(t, prefill, decode, 2, pp, dp)

	// Presented by the holder of decode rank 1's key under its own
	// envelope: the body sealed to the decode rank's pair key does not open
	// under the insider's (bad_tag).
	info, err := discovery.NewClient(boot).Rank(context.Background(), 0, 0, 0)
	require.NoError(t, err)
	var pEpoch uint64
	fmt.Sscan(strings.Fields(prefill.ready)[2], &pEpoch)
	resealed, err := control.SealAs(testauth.Auth(), ids[2], []byte(info.CertBytes()), captured[:3], control.Envelope{Sent: time.Now(), Seq: 1,
		To: wire.From{Role: wire.RolePrefill, Instance: "proc", Epoch: pEpoch}})
	require.NoError(t, err)
	resealed[2] = captured[2] // the captured sealed body, as it was
	before := prefill.stats(t).Refused[control.AuthBadTag]
	st = sendRaw(t, prefill, pEndpoint, resealed)
	require.Equal(t, before+1, st.Refused[control.AuthBadTag], "the captured body under the insider's envelope: refused %v, want one more bad_tag (%d before)", st.Refused, before)

	// The prefill rank restarts in place (same endpoint, new epoch); the
	// decode rank's next room registers with the new process and succeeds;
	// the old REGISTER replayed is for another process.
	prefill.cmd.Process.Signal(syscall.SIGKILL)
	prefill.cmd.Wait()
	prefill = startChild(t, pEnv...)
	require.Equal(t, pEndpoint, strings.Fields(prefill.ready)[1], "restarted on %s", prefill.ready)
	st = sendRaw(t, prefill, pEndpoint, captured)
	require.EqualValues(t, 1, st.Replayed[control.ReplayOtherEpoch], "the REGISTER for the predecessor: replays %v, want 1 other_epoch", st.Replayed)
	// A room started before the decode rank heard of the new process went
	// to the old one and may fail as its peer restarted (PROTOCOL.md: what
	// was bound to the old epoch fails); the next one must succeed.
	if got := pdRoomTry(t, prefill, decode, 3, pp, dp); got != "" {
		require.Contains(t, got, "peer_restarted", "room 3")
	}
	pdRoom(t, prefill, decode, 30, pp, dp)
	// The decode rank restarts too (kill -9, a new process): its
	// predecessor's REGISTER replayed is still for the predecessor of the
	// prefill process, and the new pair's rooms succeed.
	decode.cmd.Process.Signal(syscall.SIGKILL)
	decode.cmd.Wait()
	decode = startChild(t, dEnv...)
	// Counted from here: room 3's messages, when it went to the old
	// process, reach the new one as other_epoch too (seen in make test:
	// 3 where the test wanted 2).
	before = prefill.stats(t).Replayed[control.ReplayOtherEpoch]
	st = sendRaw(t, prefill, pEndpoint, captured)
	require.Equal(t, before+1, st.Replayed[control.ReplayOtherEpoch], "the old decode process's REGISTER: replays %v, want one more other_epoch (%d before)", st.Replayed, before)
	pdRoom(t, prefill, decode, 4, pp, dp)
}

// TestSecretAloneSpeaksAsNoRank (issue 23, 2): with per-rank identity a
// holder of the deployment secret — without a rank key — cannot speak as
// the prefill rank: a drained ABORT_ACK and a STATUS failed claiming it
// are refused unread by the decode rank process, and its room succeeds.
func TestSecretAloneSpeaksAsNoRank(t *testing.T) {
	t.Parallel() // its own processes and ports
	_, envs, _ := identityFiles(t,
		wire.From{Role: wire.RolePrefill, Instance: "proc"},
		wire.From{Role: wire.RoleDecode, Instance: "proc"})
	boot := startBoot(t)
	prefill := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}, envs[0]...)...)
	decode := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}, envs[1]...)...)
	pp, dp := newPagePool(pages), newPagePool(pages)
	pdRoom(t, prefill, decode, 1, pp, dp)
	pf := strings.Fields(prefill.ready)
	df := strings.Fields(decode.ready)
	var pEpoch, dEpoch uint64
	fmt.Sscan(pf[2], &pEpoch)
	fmt.Sscan(df[2], &dEpoch)
	claim := wire.From{Role: wire.RolePrefill, Instance: "proc", Endpoint: pf[1], Epoch: pEpoch}
	to := wire.From{Role: wire.RoleDecode, Instance: "proc", Epoch: dEpoch}
	var forged [][][]byte
	for i, m := range []wire.Message{&wire.AbortAck{From: claim, Room: 2, Drained: true},
		&wire.Status{From: claim, Room: 2, Status: wire.StatusFailed, Code: "failed", Reason: "forged"}} {
		f, err := wire.Encode(m)
		require.NoError(t, err)
		forged = append(forged, control.Seal(testauth.Auth(), f, control.Envelope{Sent: time.Now(), Seq: 1<<40 + uint64(i), To: to}))
	}
	// Room 2 is live while they arrive; it succeeds.
	src, dst := pp.Get(512), dp.Get(512)
	decode.do(fmt.Sprintf("RECV 2 %s %s", csv(dst), csv(src)))
	st := sendRaw(t, decode, df[1], forged...)
	require.EqualValues(t, 2, st.Refused[control.AuthNoIdentity], "the forged ABORT_ACK and STATUS: refused %v, want 2 no_identity", st.Refused)
	prefill.do(fmt.Sprintf("SEND 2 %s 16", csv(src)))
	require.Equal(t, "DONE 2 Success verified", decode.expect(t, "DONE"), "decode")
	prefill.expect(t, "DONE 2 Success")
}

// freePort returns a port nothing listens on now.
// freePort returns a tcp port on 127.0.0.1 free a moment ago.
func freePort(t *testing.T) string { return testnet.FreePort(t) }

// TestRecordCertificateIsTheRanks (review of issue 23): under per-rank
// identity a decode rank process takes a prefill rank's record only if
// its certificate is that rank's — {prefill, the instance, the global rank
// of the record's coordinates}. A record rewritten with another rank's
// certificate (a holder of the bootstrap token can write records) fails the
// room at once, saying so, instead of sending the decode rank to the wrong
// prefill rank.
func TestRecordCertificateIsTheRanks(t *testing.T) {
	t.Parallel() // its own processes and ports
	ca, envs, _ := identityFiles(t,
		wire.From{Role: wire.RolePrefill, Instance: "proc"},
		wire.From{Role: wire.RoleDecode, Instance: "proc"})
	boot := startBoot(t)
	prefill := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + boot}, envs[0]...)...)
	other, err := ca.Issue(wire.RolePrefill, "proc", 1, time.Now().Add(time.Hour))
	require.NoError(t, err)
	ctx := context.Background()
	topo, err := discovery.NewClient(boot).Topology(ctx)
	require.NoError(t, err)
	forged := startBoot(t)
	rec := records.RankRecord{Instance: topo.Instance, DPSize: topo.DPSize, TPSize: topo.TPSize, PPSize: topo.PPSize,
		Endpoint: strings.Fields(prefill.ready)[1], PageSize: topo.PageSize, DType: topo.DType, Compat: topo.Compat,
		Cert: base64.StdEncoding.EncodeToString(other.Cert.Raw()), ModelFacts: topo.ModelFacts}
	cl := discovery.NewClient(forged)
	cl.Token = testauth.Auth().BootstrapToken()
	_, err = cl.RegisterRank(ctx, rec)
	require.NoError(t, err)
	decode := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=ucx-tcp", "KVBRIDGE_E2E_BOOT=" + forged}, envs[1]...)...)
	pp, dp := newPagePool(pages), newPagePool(pages)
	src, dst := pp.Get(4), dp.Get(4)
	decode.do(fmt.Sprintf("RECV 1 %s %s", csv(dst), csv(src)))
	got := decode.expect(t, "DONE")
	require.Contains(t, strings.ReplaceAll(got, "_", " "), "carries the certificate of prefill/proc/1, want prefill/proc/0", "decode: %s, want the room failed naming the record's wrong certificate", got)
}
