package wire

import "sync"

// maxInterned bounds the interned names: past it the table starts again,
// so names a peer makes up cost memory only up to it.
const maxInterned = 4096

// internTable maps the bytes of a name to one string of them, so that a
// name decoded again is not allocated again.
type internTable struct {
	mu sync.Mutex
	m  map[string]string
}

var names = internTable{m: map[string]string{}}

func (t *internTable) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.m[string(b)]; ok { // the lookup allocates nothing
		return s
	}
	if len(t.m) >= maxInterned {
		clear(t.m)
	}
	s := string(b)
	t.m[s] = s
	return s
}
