// Package testnet holds the tests' network helpers.
package testnet

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns a tcp port on 127.0.0.1 that was free a moment ago (a
// process the test starts binds it; another may take it first, rarely).
func FreePort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		tb.Fatal(err)
	}
	return strconv.Itoa(port)
}
