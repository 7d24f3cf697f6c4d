// Package testauth holds the shared secret of the tests: one Auth for the
// ranks, and a bootstrap server that accepts its token.
package testauth

import (
	"github.com/kvbridge/kvbridge/bootstrap"
)

// Secret is the tests' shared secret.
var Secret = []byte("kvbridge-test-secret-0123456789")

// Auth returns an Auth with Secret.
func Auth() *bootstrap.Auth {
	a, err := bootstrap.NewAuth(Secret)
	if err != nil {
		panic(err)
	}
	return a
}

// Server returns an empty bootstrap server that takes writes with Secret's
// token.
func Server() *bootstrap.Server {
	s, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: Auth().BootstrapToken()})
	if err != nil {
		panic(err)
	}
	return s
}
