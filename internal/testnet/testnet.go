// Package testnet holds the network helpers of kvbridge's tests and of
// the demo's chaos rounds (which restart servers on their ports).
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// TB is the part of testing.TB FreePort uses (this package does not import
// testing: the demo links it).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// FreePort returns a tcp port on 127.0.0.1 that was free a moment ago (a
// process the test starts binds it; another may take it first, rarely),
// outside the kernel's ephemeral range (Port).
func FreePort(tb TB) string {
	tb.Helper()
	port, err := Port()
	if err != nil {
		tb.Fatal(err)
	}
	return strconv.Itoa(port)
}

// portFloor and portCeiling bound the ports Port hands out: below
// Kubernetes' NodePort range (30000–32767), whose ports kube-proxy may
// redirect on a node even with nothing listening.
const portFloor, portCeiling = 10000, 30000

// given are the ports Port handed out in this process (none twice: an
// etcd's client and peer ports are drawn one after the other).
var given struct {
	sync.Mutex
	ports map[int]bool
}

// Port returns a tcp port on 127.0.0.1 that was free a moment ago, chosen
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range: 32768
// and up by default) where the machine allows: the kernel never gives
// such a port to another socket as its ephemeral port, so a server a test
// stops and starts again on its address (etcd, a bootstrap server) finds
// it free, where a port from the ephemeral range was seen taken by
// another test's connection in between ("bind: address already in use").
// A port is handed out once per process; other processes choosing ports
// the same way collide only by chance, as with any port a test picks.
// Where the range starts too low to leave room below it (or cannot be
// read), it falls back to a port the kernel picks.
func Port() (int, error) {
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	if hi := min(ephemeralLow(), portCeiling); hi-portFloor >= 1000 {
		for range 100 {
			p := portFloor + rand.IntN(hi-portFloor)
			if given.ports[p] {
				continue
			}
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				if err := ln.Close(); err != nil {
					return 0, err
				}
				given.ports[p] = true
				return p, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testnet: no free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (0 when
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}
