package bootstrap

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testSecret is the shared secret of the tests.
var testSecret = []byte("kvbridge-test-secret-0123456789")

func testAuth() *Auth {
	a, err := NewAuth(testSecret)
	if err != nil {
		panic(err)
	}
	return a
}
