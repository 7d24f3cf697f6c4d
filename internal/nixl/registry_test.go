package nixl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEngineRegistry: the ucx engine is registered by its own package
// (linked into this test binary by engines_test.go); a program that does
// not link it gets an Open error naming the package to import, for
// EngineUCX and for EngineAuto when libnixl does not load; a second
// registration of a name panics.
func TestEngineRegistry(t *testing.T) {
	registered.Lock()
	ucxOpen := registered.open[EngineUCX]
	registered.Unlock()
	require.NotNil(t, ucxOpen, "the ucx engine is not registered: internal/nixl/ucx's init did not run")
	require.Panics(t, func() { RegisterEngine(EngineUCX, ucxOpen) }, "a second registration of %q", EngineUCX)

	registered.Lock()
	delete(registered.open, EngineUCX)
	registered.Unlock()
	t.Cleanup(func() {
		registered.Lock()
		registered.open[EngineUCX] = ucxOpen
		registered.Unlock()
	})
	_, err := Open(Config{Name: "unlinked", Engine: EngineUCX})
	require.ErrorIs(t, err, ErrEngineUnavailable)
	require.ErrorContains(t, err, `engine "ucx" is not linked into this program (import internal/nixl/ucx)`)
	_, err = Open(Config{Name: "unlinked-auto", Engine: EngineAuto, NIXLLib: "/nonexistent/libnixl_capi.so"})
	require.ErrorIs(t, err, ErrEngineUnavailable)
	require.ErrorContains(t, err, "import internal/nixl/ucx")
}
