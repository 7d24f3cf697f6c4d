package control

// A minimal binding to libzmq for the control loop's own sockets, so that
// a message costs one cgo call each way: pebbe/zmq4 makes five or six per
// frame received (init, receive, data, copy, close, RCVMORE) and one per
// frame sent, and does not expose its socket pointers. The rest of the
// package (error numbers, Z85 keys) and the tests still use pebbe/zmq4.

/*
#cgo !windows pkg-config: libzmq
#cgo noescape kvb_send
#cgo nocallback kvb_send
#cgo noescape kvb_recv
#cgo nocallback kvb_recv
#include <zmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

// Frames kept per message (a ZAP request has 7); a message with more is
// received whole and reported with KVB_MAXF+1 frames, the extra ones empty.
#define KVB_MAXF 8
// A batch takes no more messages once it holds KVB_BATCH_BYTES (control
// messages are ~100 bytes; garbage of up to ZMQ_MAXMSGSIZE per frame would
// otherwise be held 32 messages at a time before authentication).
#define KVB_BATCH_BYTES (1u << 20)
// Messages received per call at most.
#define KVB_MAXM 32

typedef struct {
	int nmsg;                       // messages held from the last call
	int nframes[KVB_MAXM];          // frames of each (KVB_MAXF+1: more than kept)
	size_t total[KVB_MAXM];         // bytes of each message's kept frames
	void *data[KVB_MAXM][KVB_MAXF];
	size_t size[KVB_MAXM][KVB_MAXF];
	zmq_msg_t part[KVB_MAXM][KVB_MAXF];
	zmq_msg_t spare;
} kvb_batch;

static void kvb_release(kvb_batch *b) {
	for (int m = 0; m < b->nmsg; m++) {
		int n = b->nframes[m] > KVB_MAXF ? KVB_MAXF : b->nframes[m];
		for (int f = 0; f < n; f++) zmq_msg_close(&b->part[m][f]);
	}
	b->nmsg = 0;
}

static kvb_batch *kvb_batch_new(void) { return calloc(1, sizeof(kvb_batch)); }

static void kvb_batch_free(kvb_batch *b) {
	kvb_release(b);
	free(b);
}

static int kvb_recv1(void *sock, zmq_msg_t *p, int flags) {
	int rc;
	zmq_msg_init(p);
	do {
		rc = zmq_msg_recv(p, sock, flags);
	} while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		int e = errno;
		zmq_msg_close(p);
		errno = e;
	}
	return rc;
}

// kvb_recv releases the previous call's messages, then receives up to
// maxm whole messages: the first as flags say (0: wait for it), the
// others only while more are queued. It returns how many it holds, or
// -errno when the first could not be received.
static int kvb_recv(void *sock, kvb_batch *b, int maxm, int flags) {
	kvb_release(b);
	if (maxm > KVB_MAXM) maxm = KVB_MAXM;
	size_t held = 0;
	for (int m = 0; m < maxm && held < KVB_BATCH_BYTES; m++) {
		int nf = 0;
		size_t total = 0;
		for (;;) {
			zmq_msg_t *p = nf < KVB_MAXF ? &b->part[m][nf] : &b->spare;
			// Only a message's first frame can be missing: ZeroMQ delivers
			// a message's frames together.
			int fl = nf > 0 ? 0 : (m == 0 ? flags : ZMQ_DONTWAIT);
			if (kvb_recv1(sock, p, fl) < 0) {
				int e = errno;
				for (int f = 0; f < nf && f < KVB_MAXF; f++) zmq_msg_close(&b->part[m][f]);
				b->nmsg = m;
				return m > 0 ? m : -e;
			}
			int more = zmq_msg_more(p);
			if (nf < KVB_MAXF) {
				b->data[m][nf] = zmq_msg_data(p);
				b->size[m][nf] = zmq_msg_size(p);
				total += b->size[m][nf];
				nf++;
			} else {
				zmq_msg_close(p);
				nf = KVB_MAXF + 1;
			}
			if (!more) break;
		}
		b->nframes[m] = nf;
		b->total[m] = total;
		b->nmsg = m + 1;
		held += total;
	}
	return b->nmsg;
}

// kvb_send sends n frames (at most 6), laid end to end in buf, as one
// message. ZeroMQ throttles the processing of its pipe credit commands
// during bursts of non-blocking sends; reading ZMQ_EVENTS processes them,
// so an EAGAIN is retried once after it. It returns 0 or -errno.
static int kvb_send(void *sock, int flags, int n, const char *buf,
		size_t l0, size_t l1, size_t l2, size_t l3, size_t l4, size_t l5) {
	size_t l[6] = {l0, l1, l2, l3, l4, l5};
	const char *p = buf;
	for (int i = 0; i < n; i++) {
		int f = flags | (i < n - 1 ? ZMQ_SNDMORE : 0);
		int rc, retried = 0;
		for (;;) {
			rc = zmq_send(sock, l[i] ? p : NULL, l[i], f);
			if (rc >= 0) break;
			if (errno == EINTR) continue;
			if (errno == EAGAIN && i == 0 && !retried) {
				int ev;
				size_t len = sizeof ev;
				zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len);
				retried = 1;
				continue;
			}
			return -errno;
		}
		p += l[i];
	}
	return 0;
}

static int kvb_term(void *ctx) {
	int rc;
	do {
		rc = zmq_ctx_term(ctx);
	} while (rc < 0 && errno == EINTR);
	return rc < 0 ? -errno : 0;
}

// Every call below may be interrupted by a signal (Go's runtime sends
// SIGURG to preempt) before it has done anything, and fails with EINTR;
// each is retried, as the sends, receives and term above are.
static int kvb_setopt(void *sock, int opt, const void *v, size_t len) {
	int rc;
	do {
		rc = zmq_setsockopt(sock, opt, v, len);
	} while (rc < 0 && errno == EINTR);
	return rc < 0 ? -errno : 0;
}

static int kvb_last_endpoint(void *sock, char *buf, size_t *len) {
	int rc;
	size_t cap = *len;
	do {
		*len = cap;
		rc = zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, len);
	} while (rc < 0 && errno == EINTR);
	return rc < 0 ? -errno : 0;
}

static int kvb_bind(void *sock, const char *ep) {
	int rc;
	do {
		rc = zmq_bind(sock, ep);
	} while (rc < 0 && errno == EINTR);
	return rc < 0 ? -errno : 0;
}

static int kvb_connect(void *sock, const char *ep) {
	int rc;
	do {
		rc = zmq_connect(sock, ep);
	} while (rc < 0 && errno == EINTR);
	return rc < 0 ? -errno : 0;
}

static void *kvb_socket(void *ctx, int type, int *err) {
	void *s;
	do {
		s = zmq_socket(ctx, type);
	} while (s == NULL && errno == EINTR);
	*err = s ? 0 : errno;
	return s;
}
static void *kvb_ctx_new(int *err) {
	void *c = zmq_ctx_new();
	*err = c ? 0 : errno;
	return c;
}
*/
import "C"

import (
	"errors"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// Socket types and options used by the loop.
const (
	zPULL = C.ZMQ_PULL
	zPUSH = C.ZMQ_PUSH
	zREP  = C.ZMQ_REP

	zLinger          = C.ZMQ_LINGER
	zSndhwm          = C.ZMQ_SNDHWM
	zRcvhwm          = C.ZMQ_RCVHWM
	zMaxmsgsize      = C.ZMQ_MAXMSGSIZE
	zReconnectIvl    = C.ZMQ_RECONNECT_IVL
	zReconnectIvlMax = C.ZMQ_RECONNECT_IVL_MAX
	zCurveServer     = C.ZMQ_CURVE_SERVER
	zCurveSecretkey  = C.ZMQ_CURVE_SECRETKEY
	zCurvePublickey  = C.ZMQ_CURVE_PUBLICKEY
	zCurveServerkey  = C.ZMQ_CURVE_SERVERKEY
	zZapDomain       = C.ZMQ_ZAP_DOMAIN

	zDontwait = C.ZMQ_DONTWAIT

	// maxFramesKept is how many frames of a message the receiver keeps.
	maxFramesKept = C.KVB_MAXF
	// recvBatch is how many queued messages one receive call takes.
	recvBatch = C.KVB_MAXM
)

// zerr converts a negative status (−errno) to pebbe's Errno, so callers
// compare with zmq.ETERM, syscall.EAGAIN and the like.
func zerr(rc C.int) error {
	if rc >= 0 {
		return nil
	}
	return zmq.Errno(-rc)
}

// zctx is a ZeroMQ context.
type zctx struct{ p unsafe.Pointer }

func newZctx() (*zctx, error) {
	var e C.int
	p := C.kvb_ctx_new(&e)
	if p == nil {
		return nil, zmq.Errno(e)
	}
	return &zctx{p: p}, nil
}

// term terminates the context: every blocking call on its sockets returns
// ETERM at once, then it waits until every socket is closed (and closed
// sockets' queued messages have lingered).
func (c *zctx) term() error { return zerr(C.kvb_term(c.p)) }

// zsock is a ZeroMQ socket; like any, it has one owner at a time.
type zsock struct {
	p unsafe.Pointer
	// out is C memory the frames to send are copied to (ZeroMQ copies them
	// again), so that the one C call per message passes no Go pointer.
	out    unsafe.Pointer
	outCap int
}

// keptOut is the largest send buffer a socket keeps between messages.
const keptOut = 64 << 10

func (c *zctx) socket(t C.int) (*zsock, error) {
	var e C.int
	p := C.kvb_socket(c.p, t, &e)
	if p == nil {
		return nil, zmq.Errno(e)
	}
	return &zsock{p: p}, nil
}

func (s *zsock) close() {
	if s != nil && s.p != nil {
		C.zmq_close(s.p)
		s.p = nil
		C.free(s.out)
		s.out, s.outCap = nil, 0
	}
}

func (s *zsock) setInt(opt C.int, v int) error {
	x := C.int(v)
	return zerr(C.kvb_setopt(s.p, opt, unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x))))
}

func (s *zsock) setInt64(opt C.int, v int64) error {
	x := C.int64_t(v)
	return zerr(C.kvb_setopt(s.p, opt, unsafe.Pointer(&x), C.size_t(unsafe.Sizeof(x))))
}

func (s *zsock) setString(opt C.int, v string) error {
	cs := C.CString(v)
	defer C.free(unsafe.Pointer(cs))
	return zerr(C.kvb_setopt(s.p, opt, unsafe.Pointer(cs), C.size_t(len(v))))
}

func (s *zsock) bind(ep string) error {
	cs := C.CString(ep)
	defer C.free(unsafe.Pointer(cs))
	return zerr(C.kvb_bind(s.p, cs))
}

func (s *zsock) connect(ep string) error {
	cs := C.CString(ep)
	defer C.free(unsafe.Pointer(cs))
	return zerr(C.kvb_connect(s.p, cs))
}

func (s *zsock) lastEndpoint() (string, error) {
	buf := (*C.char)(C.malloc(1024))
	defer C.free(unsafe.Pointer(buf))
	n := C.size_t(1024)
	if err := zerr(C.kvb_last_endpoint(s.p, buf, &n)); err != nil {
		return "", err
	}
	return C.GoString(buf), nil
}

// errTooManyFrames: a message to send has more frames than kvb_send takes.
var errTooManyFrames = errors.New("control: more than 6 frames in a message")

// send sends frames as one message in one C call; flags zDontwait or 0.
func (s *zsock) send(frames [][]byte, flags C.int) error {
	if len(frames) > 6 {
		return errTooManyFrames
	}
	var l [6]C.size_t
	total := 0
	for i, f := range frames {
		l[i] = C.size_t(len(f))
		total += len(f)
	}
	if total > s.outCap {
		C.free(s.out)
		s.outCap = max(total, 4096)
		s.out = C.malloc(C.size_t(s.outCap))
	}
	out := unsafe.Slice((*byte)(s.out), s.outCap)
	off := 0
	for _, f := range frames {
		off += copy(out[off:], f)
	}
	err := zerr(C.kvb_send(s.p, flags, C.int(len(frames)), (*C.char)(s.out), l[0], l[1], l[2], l[3], l[4], l[5]))
	if s.outCap > keptOut {
		C.free(s.out)
		s.out, s.outCap = nil, 0
	}
	return err
}

// receiver receives whole messages, several per C call, into C memory held
// until its next call; frames copies one out.
type receiver struct {
	b   *C.kvb_batch
	hdr [][]byte // frames' slice of frames, reused from one message to the next
	buf []byte   // reused's memory
}

// keptReused: the most reused keeps between messages (a larger message
// gets memory of its own, left to the collector).
const keptReused = 64 << 10

func newReceiver() *receiver {
	return &receiver{b: C.kvb_batch_new(), hdr: make([][]byte, maxFramesKept+1)}
}

func (r *receiver) free() {
	if r.b != nil {
		C.kvb_batch_free(r.b)
		r.b = nil
	}
}

// recv waits for a message on s (flags 0) or takes one if queued
// (zDontwait), and the queued ones behind it up to max; it returns how
// many it holds.
func (r *receiver) recv(s *zsock, max int, flags C.int) (int, error) {
	n := C.kvb_recv(s.p, r.b, C.int(max), flags)
	if n < 0 {
		return 0, zerr(n)
	}
	return int(n), nil
}

// recvWait is recv waiting for the first message (wait) or taking only
// what is queued (an EAGAIN error when nothing is).
func (r *receiver) recvWait(s *zsock, max int, wait bool) (int, error) {
	if wait {
		return r.recv(s, max, 0)
	}
	return r.recv(s, max, zDontwait)
}

// frames returns message i of the last recv, copied to Go memory (one
// allocation for all its bytes, which the message may keep); a message
// with more than maxFramesKept frames has maxFramesKept+1, the last ones
// empty. The slice of frames itself is the receiver's, valid until the
// next call: whoever keeps a frame keeps the frame, never the slice.
func (r *receiver) frames(i int) [][]byte {
	return r.copyOut(i, make([]byte, int(r.b.total[i])))
}

// reused is frames for a reader that keeps no byte of the message: its
// frames are copied into the receiver's own memory, reused by the next
// call, so a stream of messages allocates nothing. The control loop's
// receive goroutine reads them so: the decoder copies what a message
// keeps, the envelope's check what it remembers (and a Tap keeps
// nothing).
func (r *receiver) reused(i int) [][]byte {
	n := int(r.b.total[i])
	if n > keptReused {
		return r.frames(i)
	}
	if cap(r.buf) < n {
		r.buf = make([]byte, max(n, 1024))
	}
	return r.copyOut(i, r.buf[:n])
}

// copyOut copies message i's frames into buf (its kept frames' bytes).
func (r *receiver) copyOut(i int, buf []byte) [][]byte {
	b := r.b
	nf := int(b.nframes[i])
	kept := min(nf, maxFramesKept)
	out := r.hdr[:nf]
	off := 0
	for f := 0; f < kept; f++ {
		n := int(b.size[i][f])
		if n > 0 {
			copy(buf[off:off+n], unsafe.Slice((*byte)(b.data[i][f]), n))
		}
		out[f] = buf[off : off+n : off+n]
		off += n
	}
	for f := kept; f < nf; f++ {
		out[f] = []byte{}
	}
	clear(r.hdr[nf:]) // no earlier message's bytes kept alive
	return out
}
