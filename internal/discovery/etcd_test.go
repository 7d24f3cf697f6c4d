package discovery

import (
	"context"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/etcdtest"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func etcdRecord(tp int, endpoint string) records.RankRecord {
	return records.RankRecord{Instance: "inst-a", DPSize: 1, TPRank: tp, TPSize: 2, PPSize: 1, Endpoint: endpoint,
		PageSize: 16, DType: "bf16", Compat: "v1:abc"}
}

// nextEvent waits for the first event that matches (the deadline is a
// deadlock guard).
func nextEvent(t *testing.T, ch <-chan RankEvent, what string, match func(RankEvent) bool) RankEvent {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			require.True(t, ok, "watch closed waiting for %s", what)
			if match(ev) {
				return ev
			}
		case <-deadline:
			require.Fail(t, "no "+what)
		}
	}
}

// TestEtcdRecordsLeasesAndWatch runs the etcd backend against a real etcd
// server: records and leases, a live record not replaced by another
// endpoint, malformed records ignored and counted, a dead rank's record gone
// within its lease TTL (seen by the watch), a restarted rank picked up by
// the watch, a closed rank's record gone at once, and etcd unreachable or
// stopped giving clear errors that name the endpoint, then working again.
func TestEtcdRecordsLeasesAndWatch(t *testing.T) {
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	target := "etcd://" + srv.Endpoint + "/inst-a"
	// The rank that dies holds a 2 s lease; the others hold 10 s ones, so
	// their records do not depend on the keep-alives of a loaded machine
	// running within 2 s (make test once saw every record expire under
	// load, and the topology read below wait out its context).
	dialTTL := func(ttl time.Duration) *EtcdClient {
		c, err := DialEtcd(target, bootstrap.EtcdConfig{LeaseTTL: ttl})
		require.NoError(t, err)
		return c
	}
	dial := func() *EtcdClient { return dialTTL(10 * time.Second) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reader := dial()
	defer reader.Close()
	events := reader.Watch(ctx)
	a, b := dial(), dialTTL(2*time.Second)
	defer a.Close()
	ttl, err := a.RegisterRank(ctx, etcdRecord(0, "tcp://10.0.0.1:1"))
	require.NoError(t, err, "register: %v", ttl)
	require.Equal(t, 10*time.Second, ttl, "register")
	ttl, err = b.RegisterRank(ctx, etcdRecord(1, "tcp://10.0.0.2:1"))
	require.NoError(t, err, "register: %v", ttl)
	require.Equal(t, 2*time.Second, ttl, "register")
	topo, err := reader.Topology(ctx)
	require.NoError(t, err, "topology %+v", topo)
	require.Equal(t, 2, topo.TPSize, "topology %+v", topo)
	require.Equal(t, "inst-a", topo.Instance, "topology %+v", topo)
	ri, err := reader.Rank(ctx, 0, 1, 0)
	require.NoError(t, err, "rank %+v", ri)
	require.Equal(t, "tcp://10.0.0.2:1", ri.Endpoint, "rank %+v", ri)
	_, err = reader.Rank(ctx, 0, 7, 0)
	require.ErrorIs(t, err, ErrRankUnknown, "unknown rank")
	// Another endpoint cannot take a live rank's record.
	c := dial()
	// Its lease first, under the test's context (a loaded machine once took
	// longer than the attempt's own bound to grant it); the attempt then
	// waits for the live record's lease, in vain, until its bound.
	_, err = c.ensureLease(ctx)
	require.NoError(t, err)
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	_, err = c.RegisterRank(short, etcdRecord(1, "tcp://10.6.6.6:1"))
	stop()
	c.Close()
	require.ErrorContains(t, err, "held by tcp://10.0.0.2:1", "a live record was replaced")
	// Malformed records under the prefix are ignored and counted.
	raw, _ := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}})
	defer raw.Close()
	raw.Put(ctx, "/kvbridge/inst-a/ranks/0/5/0", "{not json")
	raw.Put(ctx, "/kvbridge/inst-a/ranks/0/6/0", `{"instance":"inst-a","dp_size":1,"tp_rank":1,"tp_size":2,"pp_size":1,"endpoint":"tcp://1.2.3.4:5","page_size":16,"dtype":"bf16","compat":"v1:abc"}`)
	topo, err = reader.Topology(ctx)
	require.NoError(t, err, "topology with malformed records: %+v", topo)
	require.Equal(t, 2, topo.TPSize, "topology with malformed records: %+v", topo)
	require.GreaterOrEqual(t, reader.Malformed(), uint64(2), "malformed records counted")
	// A rank that dies without deregistering vanishes within its lease.
	died := time.Now()
	b.abandon()
	nextEvent(t, events, "the dead rank's record deleted", func(ev RankEvent) bool { return ev.Deleted && ev.TP == 1 })
	t.Logf("record of a dead rank gone %v after its death (lease 2 s)", time.Since(died).Round(10*time.Millisecond))
	// Its restart, on another endpoint, is pushed by the watch.
	b2 := dial()
	defer b2.Close()
	_, err = b2.RegisterRank(ctx, etcdRecord(1, "tcp://10.0.0.9:1"))
	require.NoError(t, err)
	nextEvent(t, events, "the restarted rank", func(ev RankEvent) bool { return !ev.Deleted && ev.Endpoint == "tcp://10.0.0.9:1" })
	// A rank that closes deregisters at once (its lease is revoked).
	a.Close()
	nextEvent(t, events, "the closed rank's record deleted", func(ev RankEvent) bool { return ev.Deleted && ev.TP == 0 })

	// Unreachable etcd: a clear error naming the endpoint, within ctx.
	gone, err := DialEtcd("etcd://127.0.0.1:1/x", bootstrap.EtcdConfig{DialTimeout: time.Second})
	require.NoError(t, err)
	short, stop = context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = gone.Topology(short)
	stop()
	gone.Close()
	require.ErrorContains(t, err, "etcd 127.0.0.1:1", "unreachable etcd")
	// etcd stopped, then back.
	srv.Stop()
	short, stop = context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = reader.Rank(short, 0, 1, 0)
	stop()
	require.ErrorContains(t, err, "etcd "+srv.Endpoint, "stopped etcd")
	require.NoError(t, srv.Restart())
	ri, err = reader.Rank(ctx, 0, 1, 0)
	require.NoError(t, err, "after etcd came back: %+v", ri)
	require.Equal(t, "tcp://10.0.0.9:1", ri.Endpoint, "after etcd came back: %+v", ri)
}

func TestParseEtcdTarget(t *testing.T) {
	eps, inst, err := parseEtcdTarget("etcd://a:1,b:2/prefill-a")
	require.NoError(t, err, "%v %q", eps, inst)
	require.Equal(t, []string{"a:1", "b:2"}, eps)
	require.Equal(t, "prefill-a", inst)
	for _, bad := range []string{"etcd://a:1", "etcd:///x", "etcd://a:1/", "etcd://a:1/x/y", "etcd://a:1,,b:2/x", "http://a/x"} {
		_, _, err := parseEtcdTarget(bad)
		assert.Error(t, err, "%s accepted", bad)
	}
	_, err = Dial("ftp://x", DialOptions{})
	assert.Error(t, err, "ftp:// accepted")
}

// TestEtcdHolderRestoresItsRecord (issue 20, case 5): a prefill rank never
// restored its record after someone deleted it, put garbage there (its
// renewal then spun on a failing transaction) or put another endpoint's
// record; rooms recovered only when the record was written back by hand.
// The rank that holds the key restores it at its next renewal; a newcomer
// still waits for a live holder.
func TestEtcdHolderRestoresItsRecord(t *testing.T) {
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	target := "etcd://" + srv.Endpoint + "/inst-a"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := DialEtcd(target, bootstrap.EtcdConfig{LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	defer a.Close()
	mine := etcdRecord(0, "tcp://10.0.0.1:1")
	_, err = a.RegisterRank(ctx, mine)
	require.NoError(t, err)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}})
	require.NoError(t, err)
	defer raw.Close()
	key := "/kvbridge/inst-a/ranks/0/0/0"
	other := `{"instance":"inst-a","dp_size":1,"tp_rank":0,"tp_size":2,"pp_size":1,"endpoint":"tcp://6.6.6.6:6","page_size":16,"dtype":"bf16","compat":"v1:abc"}`
	for i, damage := range []struct {
		name string
		do   func() error
	}{
		{"deleted", func() error { _, err := raw.Delete(ctx, key); return err }},
		{"garbage", func() error { _, err := raw.Put(ctx, key, "{not json"); return err }},
		{"another endpoint", func() error { _, err := raw.Put(ctx, key, other); return err }},
	} {
		require.NoError(t, damage.do())
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second) // as a renewal runs: bounded by its period
		_, err := a.RegisterRank(rctx, mine)
		rcancel()
		require.NoError(t, err, "%s: renewal", damage.name)
		got, err := raw.Get(ctx, key)
		require.NoError(t, err, "%s: %v", damage.name, got)
		require.Len(t, got.Kvs, 1, "%s: %v", damage.name, got)
		rec, ok := a.parseRecord(key, got.Kvs[0].Value)
		require.True(t, ok, "%s: record not restored: %s (lease %x)", damage.name, got.Kvs[0].Value, got.Kvs[0].Lease)
		require.Equal(t, mine.Endpoint, rec.Endpoint, "%s: record not restored: %s (lease %x)", damage.name, got.Kvs[0].Value, got.Kvs[0].Lease)
		require.NotZero(t, got.Kvs[0].Lease, "%s: record not restored: %s (lease %x)", damage.name, got.Kvs[0].Value, got.Kvs[0].Lease)
		require.Equal(t, uint64(i+1), a.Restored(), "%s: restored", damage.name)
	}
	// A newcomer for the same rank still waits for the live holder.
	b, err := DialEtcd(target, bootstrap.EtcdConfig{LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	defer b.Close()
	bctx, bcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer bcancel()
	_, err = b.RegisterRank(bctx, etcdRecord(0, "tcp://10.0.0.9:1"))
	require.ErrorContains(t, err, "is held by tcp://10.0.0.1:1", "a newcomer replaced the live holder")
}

// TestEtcdLeaseLostUnderAWrite has etcd revoke the client's lease right
// before a write under it, while the client still holds it as alive (as
// when it expires on a loaded machine before its keep-alive stream ends;
// make test saw a restarted prefill rank fail to start on "requested lease
// not found"): the registration and the room's DP record are written under
// a new lease, and the loss is counted.
func TestEtcdLeaseLostUnderAWrite(t *testing.T) {
	srv, err := etcdtest.Start()
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}})
	require.NoError(t, err)
	defer raw.Close()
	a, err := DialEtcd("etcd://"+srv.Endpoint+"/inst-a", bootstrap.EtcdConfig{LeaseTTL: 30 * time.Second})
	require.NoError(t, err)
	defer a.Close()
	var revoked []clientv3.LeaseID
	a.beforeWrite = func(lease clientv3.LeaseID) {
		if len(revoked) < 2 && (len(revoked) == 0 || revoked[len(revoked)-1] != lease) {
			_, err := raw.Revoke(ctx, lease)
			assert.NoError(t, err, "revoke")
			revoked = append(revoked, lease)
		}
	}
	mine := etcdRecord(0, "tcp://10.0.0.1:1")
	_, err = a.RegisterRank(ctx, mine)
	require.NoError(t, err, "registration under a lost lease")
	require.NoError(t, a.PublishRoomDP(ctx, 7, 0), "room DP under a lost lease")
	require.Len(t, revoked, 2, "revoked %v, counted %d lost, want 2 and 2", revoked, a.LeasesLost())
	require.EqualValues(t, 2, a.LeasesLost(), "revoked %v, counted lost, want 2 and 2", revoked)
	for _, key := range []string{"/kvbridge/inst-a/ranks/0/0/0", "/kvbridge/inst-a/rooms/7"} {
		got, err := raw.Get(ctx, key)
		require.NoError(t, err, "%s: %v", key, got)
		require.Len(t, got.Kvs, 1, "%s: %v", key, got)
		l := clientv3.LeaseID(got.Kvs[0].Lease)
		require.NotZero(t, l, "%s: under lease %x (revoked %v)", key, l, revoked)
		require.NotContains(t, revoked, l, "%s: under lease %x (revoked %v)", key, l, revoked)
	}
}
