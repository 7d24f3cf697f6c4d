// Package dl holds kvb_dl.h, the one dlopen loader under kvbridge's C
// engines (gpu's CUDA driver, nixl's ucx and libnixl engines): a library
// opened once, its symbols bound from a table of (name, slot, required),
// the first missing required symbol named. The cgo packages include the
// header with `#cgo CFLAGS: -I${SRCDIR}/../internal/dl` and import this
// package for the dependency; the go command does not hash a header
// included from another directory, so after editing it run `go clean
// -cache` (or touch the including packages' files) before building.
package dl
