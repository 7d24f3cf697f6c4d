package kvmanager

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestUnreachableBootstrapNamedEarly: a prefill rank whose bootstrap
// server refuses connections says so, with the refusal, after its first
// attempt — while it goes on retrying — not only when the bootstrap
// timeout ends (issue 50: it surfaced after 60 s as "context deadline
// exceeded"); and the error it ends with names the server and the refusal.
func TestUnreachableBootstrapNamedEarly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: connections are refused

	obs, logs := observer.New(zapcore.WarnLevel)
	warned := make(chan zapcore.Entry, 16)
	hooked := zapcore.RegisterHooks(obs, func(e zapcore.Entry) error {
		select {
		case warned <- e:
		default:
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		p, err := newPrefillWith(url, zap.New(hooked), 3*registerAttempt)
		if p != nil {
			p.Close()
		}
		done <- err
	}()
	select {
	case e := <-warned:
		assert.Contains(t, e.Message, "bootstrap server does not answer")
	case err := <-done:
		t.Fatalf("NewPrefill returned (%v) before it said the bootstrap server does not answer", err)
	}
	// Still retrying: NewPrefill has not returned.
	select {
	case err := <-done:
		t.Fatalf("NewPrefill returned at the first attempt (%v): it should retry until its bootstrap timeout", err)
	default:
	}
	w := logs.FilterMessageSnippet("does not answer").All()
	require.NotEmpty(t, w)
	fields := w[0].ContextMap()
	assert.Equal(t, url, fields["bootstrap"])
	assert.Contains(t, fields["error"], "connection refused")

	err = <-done
	require.Error(t, err)
	assert.Contains(t, err.Error(), url)
	assert.Contains(t, err.Error(), "connection refused")
}

// newPrefillWith starts a prefill rank (loopback engine) registering with
// the bootstrap server at url.
func newPrefillWith(url string, log *zap.Logger, bootTimeout time.Duration) (*Prefill, error) {
	cfg := testPrefillConfig()
	cfg.BootstrapURL, cfg.Logger = url, log
	cfg.Registry.BootstrapTimeout = bootTimeout
	return NewPrefill(cfg)
}
