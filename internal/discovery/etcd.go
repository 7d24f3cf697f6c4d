package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdClient is the etcd discovery backend for one prefill instance. Rank
// records are the JSON of records.RankRecord under
// /kvbridge/<instance>/ranks/<dp>/<tp>/<pp>, each attached to a lease its
// rank keeps alive, so a dead rank's record vanishes within the lease TTL;
// rooms' DP groups are under /kvbridge/<instance>/rooms/<room>. Records
// that do not parse or validate are ignored and counted.
type EtcdClient struct {
	cli       *clientv3.Client
	endpoints string
	instance  string
	prefix    string
	ttl       time.Duration

	mu      sync.Mutex
	lease   clientv3.LeaseID
	stopKA  context.CancelFunc
	bad     atomic.Uint64
	closed  bool
	kaAlive chan struct{} // closed when the keep-alive stream ends
	// held maps a rank key to the lease under which this client last put
	// its record there: while that lease lives the client holds the rank
	// and restores a record that was deleted, overwritten or garbled.
	held     map[string]clientv3.LeaseID
	restored atomic.Uint64
	lost     atomic.Uint64
	// beforeWrite, when set (tests), runs before a write under the lease.
	beforeWrite func(clientv3.LeaseID)
}

// parseEtcdTarget splits etcd://host:port[,host:port]/<instance>.
func parseEtcdTarget(target string) (endpoints []string, instance string, err error) {
	rest, ok := strings.CutPrefix(target, "etcd://")
	hosts, inst, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || hosts == "" || inst == "" || strings.Contains(inst, "/") || len(inst) > wire.MaxNameBytes {
		return nil, "", fmt.Errorf("bootstrap: etcd target %.64q: want etcd://host:port[,host:port]/instance", target)
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, "", fmt.Errorf("bootstrap: etcd target %.64q: empty endpoint", target)
		}
		endpoints = append(endpoints, h)
	}
	return endpoints, inst, nil
}

// DialEtcd connects to the etcd cluster of target for its instance.
func DialEtcd(target string, c bootstrap.EtcdConfig) (*EtcdClient, error) {
	eps, inst, err := parseEtcdTarget(target)
	if err != nil {
		return nil, err
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 15 * time.Second
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: c.DialTimeout, Username: c.Username, Password: c.Password,
		Logger: zap.NewNop(), DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 5 * time.Second}
	if c.CACert != "" || c.Cert != "" {
		t := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.CACert != "" {
			pem, err := os.ReadFile(c.CACert)
			if err != nil {
				return nil, fmt.Errorf("bootstrap: etcd CA certificate: %w", err)
			}
			t.RootCAs = x509.NewCertPool()
			if !t.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("bootstrap: etcd CA certificate %s: no PEM certificate in it", c.CACert)
			}
		}
		if c.Cert != "" {
			kp, err := tls.LoadX509KeyPair(c.Cert, c.Key)
			if err != nil {
				return nil, fmt.Errorf("bootstrap: etcd client certificate: %w", err)
			}
			t.Certificates = []tls.Certificate{kp}
		}
		cfg.TLS = t
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: etcd %s: %w", strings.Join(eps, ","), err)
	}
	return &EtcdClient{cli: cli, endpoints: strings.Join(eps, ","), instance: inst, prefix: "/kvbridge/" + inst + "/", ttl: c.LeaseTTL}, nil
}

func (e *EtcdClient) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bootstrap: etcd %s: instance %q: %s: %w", e.endpoints, e.instance, what, err)
}

func (e *EtcdClient) rankKey(dp, tp, pp int) string {
	return fmt.Sprintf("%sranks/%d/%d/%d", e.prefix, dp, tp, pp)
}

// parseRecord decodes and validates a rank record stored at key.
func (e *EtcdClient) parseRecord(key string, val []byte) (records.RankRecord, bool) {
	var rec records.RankRecord
	dec := json.NewDecoder(strings.NewReader(string(val)))
	if len(val) > 64<<10 || dec.Decode(&rec) != nil || dec.More() || rec.Validate() != nil || rec.Instance != e.instance ||
		key != e.rankKey(rec.DPRank, rec.TPRank, rec.PPRank) {
		e.bad.Add(1)
		return rec, false
	}
	return rec, true
}

// Malformed counts records under the instance's prefix that were ignored.
func (e *EtcdClient) Malformed() uint64 { return e.bad.Load() }

// ensureLease grants the rank's lease and keeps it alive, once; a lease
// lost (etcd down past the TTL) is granted again.
func (e *EtcdClient) ensureLease(ctx context.Context) (clientv3.LeaseID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errors.New("closed")
	}
	if e.lease != 0 {
		select {
		case <-e.kaAlive:
			e.lease = 0 // the keep-alive stream ended: the lease may be gone
		default:
			return e.lease, nil
		}
	}
	g, err := e.cli.Grant(ctx, int64(max(e.ttl/time.Second, 1)))
	if err != nil {
		return 0, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	ch, err := e.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		cancel()
		return 0, err
	}
	alive := make(chan struct{})
	go func() {
		defer close(alive)
		for range ch { // drain the keep-alive answers
		}
	}()
	if e.stopKA != nil {
		e.stopKA()
	}
	e.lease, e.stopKA, e.kaAlive = g.ID, cancel, alive
	return g.ID, nil
}

// dropLease forgets lease after etcd answered that it no longer exists
// (it expired while its keep-alive stream had not yet ended: a loaded
// machine, etcd stalled past the TTL), so the next ensureLease grants a
// new one instead of handing the dead lease out again.
func (e *EtcdClient) dropLease(lease clientv3.LeaseID) {
	e.lost.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease != lease {
		return
	}
	if e.stopKA != nil {
		e.stopKA()
	}
	e.lease, e.stopKA = 0, nil
}

// LeasesLost counts the leases etcd reported gone when this client wrote
// under them; each was replaced by a new one and the write retried.
func (e *EtcdClient) LeasesLost() uint64 { return e.lost.Load() }

// Restored counts the rank records this client put back after finding
// them deleted, garbled or naming another endpoint while it held the rank.
func (e *EtcdClient) Restored() uint64 { return e.restored.Load() }

// RegisterRank puts the rank's record under its lease, and renews it when
// called again. A newcomer does not replace a valid record of another
// endpoint: the call waits (until ctx ends) for that record's lease to
// lapse, as the HTTP server answers 409. The client that holds the rank
// (its put succeeded under the lease it still keeps alive) restores its
// record when it finds it deleted, garbled, or naming another endpoint:
// nobody else may write there while that lease lives, so such a record is
// damage, not a successor.
func (e *EtcdClient) RegisterRank(ctx context.Context, rec records.RankRecord) (time.Duration, error) {
	if err := rec.Validate(); err != nil {
		return 0, fmt.Errorf("bootstrap: rank record: %w", err)
	}
	if rec.Instance != e.instance {
		return 0, fmt.Errorf("bootstrap: rank record of instance %q published to %q", rec.Instance, e.instance)
	}
	body, _ := json.Marshal(rec)
	key := e.rankKey(rec.DPRank, rec.TPRank, rec.PPRank)
	for {
		lease, err := e.ensureLease(ctx)
		if err != nil {
			return 0, e.wrap("lease", err)
		}
		resp, err := e.cli.Get(ctx, e.prefix+"ranks/", clientv3.WithPrefix())
		if err != nil {
			return 0, e.wrap("get ranks", err)
		}
		e.mu.Lock()
		holder := e.held[key] == lease
		e.mu.Unlock()
		rev := int64(0)
		conflict, damaged := "", holder // our key missing is damage
		for _, kv := range resp.Kvs {
			other, ok := e.parseRecord(string(kv.Key), kv.Value)
			switch {
			case string(kv.Key) == key:
				// Garbage there is replaced by anyone; a valid record of
				// another endpoint only by the holder.
				rev, damaged = kv.ModRevision, string(kv.Value) != string(body)
				if ok && other.Endpoint != rec.Endpoint && !holder {
					conflict = fmt.Sprintf("rank dp=%d tp=%d pp=%d is held by %s until its lease lapses", rec.DPRank, rec.TPRank, rec.PPRank, other.Endpoint)
				}
			case !ok:
			case other.Topology() != rec.Topology():
				return 0, fmt.Errorf("bootstrap: etcd %s: rank dp=%d tp=%d pp=%d declares %+v but the instance holds %+v",
					e.endpoints, rec.DPRank, rec.TPRank, rec.PPRank, rec.Topology(), other.Topology())
			}
		}
		if conflict == "" {
			if e.beforeWrite != nil {
				e.beforeWrite(lease)
			}
			cmp := clientv3.Compare(clientv3.ModRevision(key), "=", rev)
			tx, err := e.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(body), clientv3.WithLease(lease))).Commit()
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				// Our lease expired under us (so we no longer hold the
				// rank either): grant a new one and look again.
				e.dropLease(lease)
				continue
			}
			if err != nil {
				return 0, e.wrap("put rank", err)
			}
			if tx.Succeeded {
				e.mu.Lock()
				if e.held == nil {
					e.held = map[string]clientv3.LeaseID{}
				}
				e.held[key] = lease
				e.mu.Unlock()
				if holder && damaged {
					e.restored.Add(1)
				}
				return e.ttl, nil
			}
			continue // the key changed under us: look again
		}
		if err := e.waitChange(ctx, key, resp.Header.Revision, false); err != nil {
			return 0, e.wrap(conflict, err)
		}
	}
}

// waitChange waits for any change of key (or of keys under it, with
// prefix) after revision rev.
func (e *EtcdClient) waitChange(ctx context.Context, key string, rev int64, prefix bool) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRev(rev + 1)}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	for wr := range e.cli.Watch(wctx, key, opts...) {
		if err := wr.Err(); err != nil {
			return err
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	return ctx.Err()
}

// DeregisterRank deletes the rank's record if it is still its own.
func (e *EtcdClient) DeregisterRank(ctx context.Context, dp, tp, pp int, endpoint string) error {
	key := e.rankKey(dp, tp, pp)
	resp, err := e.cli.Get(ctx, key)
	if err != nil {
		return e.wrap("get rank", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	if rec, ok := e.parseRecord(key, resp.Kvs[0].Value); ok && rec.Endpoint != endpoint {
		return fmt.Errorf("bootstrap: etcd %s: rank dp=%d tp=%d pp=%d is held by %s, not %s", e.endpoints, dp, tp, pp, rec.Endpoint, endpoint)
	}
	_, err = e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	return e.wrap("delete rank", err)
}

// records.Topology waits until every rank of the instance has a valid record and
// returns the instance's shape.
func (e *EtcdClient) Topology(ctx context.Context) (records.Topology, error) {
	for {
		resp, err := e.cli.Get(ctx, e.prefix+"ranks/", clientv3.WithPrefix())
		if err != nil {
			return records.Topology{}, e.wrap("get ranks", err)
		}
		var topo *records.Topology
		seen := map[string]bool{}
		why := "no prefill rank has registered yet"
		for _, kv := range resp.Kvs {
			rec, ok := e.parseRecord(string(kv.Key), kv.Value)
			if !ok {
				continue
			}
			t := rec.Topology()
			if topo == nil {
				topo = &t
			} else if *topo != t {
				why = fmt.Sprintf("ranks disagree on the topology: %+v and %+v", *topo, t)
				topo = nil
				break
			}
			seen[string(kv.Key)] = true
		}
		if topo != nil {
			want := topo.DPSize * topo.TPSize * topo.PPSize
			if len(seen) == want {
				return *topo, nil
			}
			why = fmt.Sprintf("%d of %d prefill ranks registered", len(seen), want)
		}
		if err := e.waitChange(ctx, e.prefix+"ranks/", resp.Header.Revision, true); err != nil {
			return records.Topology{}, e.wrap(why, err)
		}
	}
}

// Rank returns one rank's endpoint and key.
func (e *EtcdClient) Rank(ctx context.Context, dp, tp, pp int) (records.RankInfo, error) {
	key := e.rankKey(dp, tp, pp)
	resp, err := e.cli.Get(ctx, key)
	if err != nil {
		return records.RankInfo{}, e.wrap("get rank", err)
	}
	if len(resp.Kvs) == 0 {
		return records.RankInfo{}, fmt.Errorf("%w: etcd %s: instance %q dp=%d tp=%d pp=%d", ErrRankUnknown, e.endpoints, e.instance, dp, tp, pp)
	}
	rec, ok := e.parseRecord(key, resp.Kvs[0].Value)
	if !ok {
		return records.RankInfo{}, fmt.Errorf("%w: etcd %s: instance %q dp=%d tp=%d pp=%d: malformed record", ErrRankUnknown, e.endpoints, e.instance, dp, tp, pp)
	}
	return records.RankInfo{Endpoint: rec.Endpoint, PublicKey: rec.PublicKey, Cert: rec.Cert, Epoch: rec.Epoch}, nil
}

// PublishRoomDP records a room's DP group under the rank's lease (it
// vanishes with the rank).
func (e *EtcdClient) PublishRoomDP(ctx context.Context, room uint64, dp int) error {
	for {
		lease, err := e.ensureLease(ctx)
		if err != nil {
			return e.wrap("lease", err)
		}
		if e.beforeWrite != nil {
			e.beforeWrite(lease)
		}
		_, err = e.cli.Put(ctx, e.prefix+"rooms/"+strconv.FormatUint(room, 10), strconv.Itoa(dp), clientv3.WithLease(lease))
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			e.dropLease(lease) // expired under us: grant a new one
			continue
		}
		return e.wrap("put room", err)
	}
}

// RoomDP waits (until ctx ends) for a room's DP group.
func (e *EtcdClient) RoomDP(ctx context.Context, room uint64) (int, error) {
	key := e.prefix + "rooms/" + strconv.FormatUint(room, 10)
	for {
		resp, err := e.cli.Get(ctx, key)
		if err != nil {
			return 0, e.wrap("get room", err)
		}
		if len(resp.Kvs) > 0 {
			dp, err := strconv.Atoi(string(resp.Kvs[0].Value))
			if err != nil || dp < 0 || dp >= wire.MaxRanks {
				e.bad.Add(1)
				return 0, fmt.Errorf("bootstrap: etcd %s: room %d: malformed DP group %.16q", e.endpoints, room, resp.Kvs[0].Value)
			}
			return dp, nil
		}
		if err := e.waitChange(ctx, key, resp.Header.Revision, false); err != nil {
			return 0, e.wrap(fmt.Sprintf("room %d has no DP group yet", room), err)
		}
	}
}

// Watch streams changes to the instance's rank records; malformed ones are
// skipped and counted. The channel closes when ctx ends.
func (e *EtcdClient) Watch(ctx context.Context) <-chan RankEvent {
	out := make(chan RankEvent, 64)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			for wr := range e.cli.Watch(clientv3.WithRequireLeader(ctx), e.prefix+"ranks/", clientv3.WithPrefix()) {
				for _, ev := range wr.Events {
					var re RankEvent
					key := string(ev.Kv.Key)
					if ev.Type == clientv3.EventTypeDelete {
						if _, err := fmt.Sscanf(strings.TrimPrefix(key, e.prefix+"ranks/"), "%d/%d/%d", &re.DP, &re.TP, &re.PP); err != nil {
							e.bad.Add(1)
							continue
						}
						re.Deleted = true
					} else {
						rec, ok := e.parseRecord(key, ev.Kv.Value)
						if !ok {
							continue
						}
						re = RankEvent{DP: rec.DPRank, TP: rec.TPRank, PP: rec.PPRank, Endpoint: rec.Endpoint, PublicKey: rec.PublicKey, Cert: rec.Cert, Epoch: rec.Epoch}
					}
					select {
					case out <- re:
					case <-ctx.Done():
						return
					}
				}
			}
			// The watch ended (etcd unreachable, no leader): start over
			// after a pause, unless ctx ended.
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return out
}

// Close stops the lease's keep-alive, revokes it (the rank's records
// vanish at once) and closes the connection.
func (e *EtcdClient) Close() error {
	e.mu.Lock()
	e.closed = true
	lease, stop := e.lease, e.stopKA
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	if lease != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = e.cli.Revoke(ctx, lease)
		cancel()
	}
	return e.cli.Close()
}

// abandon closes the connection without revoking the lease, as a killed
// process would (tests).
func (e *EtcdClient) abandon() {
	e.mu.Lock()
	e.closed = true
	stop := e.stopKA
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	e.cli.Close()
}
