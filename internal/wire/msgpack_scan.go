package wire

import (
	"encoding/binary"
	"errors"
	"math"
)

// A small, allocation-light MessagePack reader for untrusted bodies. It never
// recurses (a body of 64 MiB of nested array headers cannot overflow the
// stack), checks every length against the bytes that remain (a header that
// claims 4 billion elements cannot allocate), and reports wrong types
// precisely. Encoding uses github.com/vmihailenco/msgpack/v5.

var (
	errTruncated = errors.New("truncated")
	errBadCode   = errors.New("invalid msgpack code")
)

// mpKind is the broad type of the next value.
type mpKind uint8

const (
	mpNil mpKind = 1 + iota
	mpBool
	mpInt // signed or unsigned integer
	mpFloat
	mpStr
	mpBin
	mpArray
	mpMap
	mpExt
)

func (k mpKind) String() string {
	return [...]string{"invalid", "nil", "bool", "int", "float", "str", "bin", "array", "map", "ext"}[min(int(k), 9)]
}

type scanner struct {
	b   []byte
	off int
}

func (s *scanner) remaining() int { return len(s.b) - s.off }

func (s *scanner) need(n int) error {
	if n < 0 || s.remaining() < n {
		return errTruncated
	}
	return nil
}

func (s *scanner) be(n int) uint64 {
	var v uint64
	for _, c := range s.b[s.off : s.off+n] {
		v = v<<8 | uint64(c)
	}
	s.off += n
	return v
}

// kind peeks at the next value's type.
func (s *scanner) kind() (mpKind, error) {
	if err := s.need(1); err != nil {
		return 0, err
	}
	c := s.b[s.off]
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		return mpInt, nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return mpMap, nil
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return mpArray, nil
	case c >= 0xa0 && c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return mpStr, nil
	case c == 0xc0:
		return mpNil, nil
	case c == 0xc2, c == 0xc3:
		return mpBool, nil
	case c >= 0xc4 && c <= 0xc6:
		return mpBin, nil
	case c == 0xca, c == 0xcb:
		return mpFloat, nil
	case (c >= 0xc7 && c <= 0xc9) || (c >= 0xd4 && c <= 0xd8):
		return mpExt, nil
	}
	return 0, errBadCode // 0xc1 is never used
}

// header reads the next value's header. For str, bin and ext it returns the
// payload length (ext: including its type byte); for arrays the element
// count; for maps the pair count; for scalars it consumes the whole value
// and returns 0.
func (s *scanner) header() (mpKind, int, error) {
	// The one-byte forms most of a body is made of, first.
	if s.off < len(s.b) {
		switch c := s.b[s.off]; {
		case c <= 0x7f:
			s.off++
			return mpInt, 0, nil
		case c >= 0xa0 && c <= 0xbf:
			s.off++
			n := int(c & 0x1f)
			if len(s.b)-s.off < n {
				return mpStr, n, errTruncated
			}
			return mpStr, n, nil
		}
	}
	k, err := s.kind()
	if err != nil {
		return 0, 0, err
	}
	c := s.b[s.off]
	s.off++
	fixed := func(n int) (int, error) {
		if err := s.need(n); err != nil {
			return 0, err
		}
		return int(s.be(n)), nil
	}
	var n int
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return k, 0, nil
	case c >= 0x80 && c <= 0x8f:
		n = int(c & 0x0f)
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xcc || c == 0xd0:
		_, err = fixed(1)
		return k, 0, err
	case c == 0xcd || c == 0xd1:
		_, err = fixed(2)
		return k, 0, err
	case c == 0xce || c == 0xd2 || c == 0xca:
		_, err = fixed(4)
		return k, 0, err
	case c == 0xcf || c == 0xd3 || c == 0xcb:
		if err := s.need(8); err != nil {
			return 0, 0, err
		}
		s.off += 8
		return k, 0, nil
	case c == 0xc4 || c == 0xd9:
		n, err = fixed(1)
	case c == 0xc5 || c == 0xda || c == 0xdc || c == 0xde:
		n, err = fixed(2)
	case c == 0xc6 || c == 0xdb || c == 0xdd || c == 0xdf:
		n, err = fixed(4)
	case c >= 0xd4 && c <= 0xd8: // fixext 1..16 plus a type byte
		n = 1 + 1<<(c-0xd4)
	case c == 0xc7:
		n, err = fixed(1)
		n++
	case c == 0xc8:
		n, err = fixed(2)
		n++
	case c == 0xc9:
		n, err = fixed(4)
		n++
	}
	if err != nil {
		return 0, 0, err
	}
	// Every element of an array takes at least one byte, every map pair two.
	switch k {
	case mpArray:
		err = s.need(n)
	case mpMap:
		if n > math.MaxInt32 {
			err = errTruncated
		} else {
			err = s.need(2 * n)
		}
	default:
		err = s.need(n)
	}
	return k, n, err
}

// skip consumes one whole value without recursion.
func (s *scanner) skip() error {
	for pending := 1; pending > 0; pending-- {
		k, n, err := s.header()
		if err != nil {
			return err
		}
		switch k {
		case mpStr, mpBin, mpExt:
			s.off += n
		case mpArray:
			pending += n
		case mpMap:
			pending += 2 * n
		}
	}
	return nil
}

// raw returns the bytes of the next value and consumes it.
func (s *scanner) raw() ([]byte, error) {
	start := s.off
	if err := s.skip(); err != nil {
		return nil, err
	}
	return s.b[start:s.off], nil
}

// typeError says a value has the wrong type.
type typeError struct{ want, got mpKind }

func (e *typeError) Error() string { return "want " + e.want.String() + ", got " + e.got.String() }

func (s *scanner) expect(want mpKind) (int, error) {
	k, err := s.kind()
	if err != nil {
		return 0, err
	}
	if k != want {
		return 0, &typeError{want, k}
	}
	_, n, err := s.header()
	return n, err
}

// peekLen returns the length of the str or bin value at the cursor without
// moving it.
func (s *scanner) peekLen(want mpKind) (int, error) {
	off := s.off
	defer func() { s.off = off }()
	return s.expect(want)
}

func (s *scanner) str() (string, error) {
	n, err := s.expect(mpStr)
	if err != nil {
		return "", err
	}
	v := string(s.b[s.off : s.off+n])
	s.off += n
	return v, nil
}

func (s *scanner) bin() ([]byte, error) {
	n, err := s.expect(mpBin)
	if err != nil {
		return nil, err
	}
	v := append([]byte{}, s.b[s.off:s.off+n]...)
	s.off += n
	return v, nil
}

func (s *scanner) boolean() (bool, error) {
	if _, err := s.expect(mpBool); err != nil {
		return false, err
	}
	return s.b[s.off-1] == 0xc3, nil
}

// integer reads any integer encoding. neg is true for a negative value, in
// which case v holds it as int64 bits.
func (s *scanner) integer() (v uint64, neg bool, err error) {
	k, err := s.kind()
	if err != nil {
		return 0, false, err
	}
	if k != mpInt {
		return 0, false, &typeError{mpInt, k}
	}
	c := s.b[s.off]
	s.off++
	read := func(n int) (uint64, error) {
		if err := s.need(n); err != nil {
			return 0, err
		}
		return s.be(n), nil
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	case c >= 0xcc && c <= 0xcf:
		v, err = read(1 << (c - 0xcc))
		return v, false, err
	default: // 0xd0..0xd3
		n := 1 << (c - 0xd0)
		v, err = read(n)
		if err != nil {
			return 0, false, err
		}
		shift := 64 - 8*n
		iv := int64(v<<shift) >> shift
		return uint64(iv), iv < 0, nil
	}
}

// pagesFromBin decodes little-endian uint32 page indices.
func pagesFromBin(b []byte) ([]uint32, bool) {
	if len(b)%4 != 0 {
		return nil, false
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out, true
}

// pagesToBin encodes page indices as little-endian uint32 (never nil, so an
// empty list is an empty bin, not nil).
func pagesToBin(p []uint32) []byte {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}
