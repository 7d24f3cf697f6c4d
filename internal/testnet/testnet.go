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
	"testing"
)

// FreePort returns a tcp port on 127.0.0.1 that was free a moment ago (a
// process the test starts binds it; another may take it first, rarely),
// outside the kernel's ephemeral range (Port).
func FreePort(tb testing.TB) string {
	tb.Helper()
	port, err := Port()
	if err != nil {
		tb.Fatal(err)
	}
	return strconv.Itoa(port)
}

// portFloor is the lowest port Port hands out.
const portFloor = 10000

// Port returns a tcp port on 127.0.0.1 that was free a moment ago, chosen
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range: 32768
// and up by default) where the machine allows: the kernel never gives
// such a port to another socket as its ephemeral port, so a server a test
// stops and starts again on its address (etcd, a bootstrap server) finds
// it free, where a port from the ephemeral range was seen taken by
// another test's connection in between ("bind: address already in use").
// Other tests choosing ports the same way collide only by chance, as
// with any port a test picks.
func Port() (int, error) {
	if lo := ephemeralLow(); lo-portFloor >= 1000 {
		for range 100 {
			p := portFloor + rand.IntN(lo-portFloor)
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				if err := ln.Close(); err != nil {
					return 0, err
				}
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
