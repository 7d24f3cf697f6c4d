package nixl_test

// The ucx engine lives in a package of its own that registers itself with
// this one. This package's tests run the contract over it, so the test
// binary links it: its init registers it with the same package the
// internal tests use.
import _ "github.com/kvbridge/kvbridge/internal/nixl/ucx"
