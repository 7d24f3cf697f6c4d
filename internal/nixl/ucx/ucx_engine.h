// The C half of the ucx engine: thin helpers over libucp, all called from
// the engine's progress goroutine, one call at a time (the worker is
// UCS_THREAD_MODE_SERIALIZED). Callbacks
// only set fields in C structs; Go reads them after progress, so no Go code
// runs inside UCX.
#ifndef KVB_UCX_ENGINE_H
#define KVB_UCX_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "ucx_abi.h"

#define KVB_AM_NOTIF 7
// Writes to a peer whose puts UCX would emulate (tcp): the data as active
// messages, each acknowledged by the target once copied (kvb_xfer_start).
#define KVB_AM_WRITE 8
#define KVB_AM_WACK 9
// A connection's first round trip (kvb_ep_wireup): the target answers a
// PING through its reply endpoint, after its own wire-up reply has left.
#define KVB_AM_PING 10
#define KVB_AM_PONG 11
// Reads from such a peer (kvbridge's ownership proofs): a request per
// chunk, answered with the bytes once the target checked they lie in
// memory it mapped — UCX's own get emulation reads whatever address the
// initiator names, and a bad one kills the target (SIGSEGV).
#define KVB_AM_READ 12
#define KVB_AM_RDATA 13
// KVB_RDATA_PENDING bounds the answers' bytes a target has queued and not
// yet sent: a reader that asks and never drains its socket gets refusals,
// not this process's memory.
#define KVB_RDATA_PENDING (8u << 20)
// KVB_AM_CHUNK is the largest write message: a target holds one such
// message at a time per sender while UCX reassembles it.
#define KVB_AM_CHUNK (256 * 1024)
// KVB_READ_WINDOW is how many of a read's chunk requests are out ahead of
// their answers: one read of any size keeps at most this many chunks
// queued at its target (a quarter of KVB_RDATA_PENDING), where asking for
// every chunk at once had a read above 8 MiB refused whenever the target
// queued answers faster than tcp sent them. The bound is the target's,
// shared by every read of it: several large reads at once can still be
// refused busy when the target falls behind.
#define KVB_READ_WINDOW (KVB_RDATA_PENDING / KVB_AM_CHUNK / 4)

// kvb_whdr heads a KVB_AM_WRITE message: the write's token (the sender's,
// echoed in the ack) and where the payload goes in the target.
typedef struct kvb_whdr {
	uint64_t token;
	uint64_t addr;
} kvb_whdr;

// kvb_wack acknowledges one KVB_AM_WRITE: its payload's length, and 0 or
// the status that refused it (not copied).
typedef struct kvb_wack {
	uint64_t token;
	uint64_t len;
	int64_t status;
} kvb_wack;

// kvb_rhdr heads a KVB_AM_READ message: the read's token and the chunk's
// index (both echoed in the answer) and the bytes it asks for in the
// target (at most KVB_AM_CHUNK).
typedef struct kvb_rhdr {
	uint64_t token;
	uint64_t index;
	uint64_t addr;
	uint64_t len;
} kvb_rhdr;

// kvb_rdata heads a KVB_AM_RDATA answer: token and index echoed, and 0 with
// the bytes as its payload, or the status that refused the read (no
// payload).
typedef struct kvb_rdata {
	uint64_t token;
	uint64_t index;
	int64_t status;
} kvb_rdata;

// kvb_region is host memory this worker mapped: a KVB_AM_WRITE lands only
// inside one.
typedef struct kvb_region {
	ucp_mem_h memh;
	uintptr_t addr;
	size_t len;
} kvb_region;

typedef struct kvb_notif {
	struct kvb_notif *next;
	char *name;
	size_t name_len;
	void *data;
	size_t data_len;
} kvb_notif;

typedef struct kvb_ep {
	ucp_ep_h ep;
	volatile int failed;
	ucs_status_t status;
	int answered;               // the peer answered the wire-up PING
	int emulated;               // no rma_bw lane: writes go as KVB_AM_WRITE
	void *close_req;            // the close in progress
	int abandoned;              // past its bound: no longer waited for
	long close_deadline_ms;     // when the close is left to UCX
	struct kvb_ep *next_closed; // on kvb_ctx.closed while closing
} kvb_ep;

typedef struct kvb_ctx {
	ucp_context_h ctx;
	ucp_worker_h worker;
	kvb_notif *head, *tail;
	kvb_ep *closed;                  // endpoints closing
	unsigned closing;                // of those, closes still waited for
	kvb_region *regions;             // mapped host memory (kvb_mem_map)
	size_t nregions, capregions;
	struct kvb_xfer *amx;            // transfers waiting for KVB_AM_WACKs
	uint64_t next_token;
	uint64_t ping_token; // the PING kvb_ep_wireup waits for, and
	int pong_seen;       // whether its PONG came
	int no_pong;         // tests: answer no PING, as a build without it
	// Counters of bad input on the message path: KVB_AM_WRITEs and
	// KVB_AM_READs refused (malformed, rendezvous, outside mapped memory)
	// and acks or read answers for no transfer in flight (late, after a
	// cancel, or forged) or not matching its request.
	unsigned long writes_refused, acks_unknown;
	// read_ahead_max: the most chunk requests any one read had out ahead
	// of its answers, since the context began (at most KVB_READ_WINDOW).
	unsigned long read_ahead_max;
	size_t rdata_pending; // bytes of KVB_AM_RDATA answers queued, not yet sent
	// tests: answer reads as a broken or hostile target would — 1: each
	// answer sent again with other bytes; 2: an answer for a chunk index
	// past the read's; 3: one byte short; 4: each answer sent again for
	// the chunk 2 × KVB_READ_WINDOW further on (not requested yet).
	int test_bad_answers;
} kvb_ctx;

enum {
	KVB_XFER_IDLE = 0,
	KVB_XFER_FLUSHING = 1, // data posted, waiting for remote completion
	KVB_XFER_NOTIFY = 2,   // data visible at the target, notification to send
	KVB_XFER_NOTIFYING = 3,
	KVB_XFER_DONE = 4,
	KVB_XFER_FAILED = -1,
};

typedef struct kvb_xfer {
	int stage;
	ucs_status_t status;
	int outstanding; // requests whose callback has not run yet
	int flush_done;
	ucs_status_t flush_status;
	int am_done;
	ucs_status_t am_status;
	void *flush_req;
	void *am_req;
	kvb_ep *ep;
	// An active-message write (ep->emulated): its token, bytes sent and
	// acknowledged, the first failure, and the message headers, which UCX
	// reads until each send completes (freed by kvb_xfer_free). A read
	// (am_read too) counts the bytes answered in am_acked; rhdrs are its
	// requests, rdst where each chunk's answer goes, rgot which came,
	// rsent how many requests went out (a window ahead of the answers).
	int am_write, am_read;
	uint64_t token, am_total, am_acked;
	ucs_status_t am_wstatus;
	kvb_whdr *whdrs;
	kvb_rhdr *rhdrs;
	uint64_t *rdst;
	unsigned char *rgot;
	size_t rchunks, rsent, ranswered;
	struct kvb_xfer *amnext; // on kvb_ctx.amx while waiting for acks
} kvb_xfer;

int kvb_init(kvb_ctx **out, const char **keys, const char **vals, int n, char *err, size_t errlen);
void kvb_destroy(kvb_ctx *c);
int kvb_worker_address(kvb_ctx *c, void **addr, size_t *len);
unsigned kvb_progress(kvb_ctx *c);
// kvb_efd gives the worker's event fd: readable when the worker has events
// to progress, once kvb_arm returned 0 (UCS_OK). kvb_arm returns
// UCS_ERR_BUSY while events are pending (progress, then arm again).
int kvb_efd(kvb_ctx *c, int *fd);
int kvb_arm(kvb_ctx *c);

int kvb_mem_map(kvb_ctx *c, uintptr_t addr, size_t len, int allocate, ucp_mem_h *memh, uintptr_t *out_addr,
		void **rkey, size_t *rkey_len);
char *kvb_ptr(uintptr_t addr);
void kvb_mem_unmap(kvb_ctx *c, ucp_mem_h memh);

int kvb_ep_create(kvb_ctx *c, const void *addr, int peer_errors, kvb_ep **out);
void kvb_ep_close(kvb_ctx *c, kvb_ep *e, unsigned wait_ms);
unsigned kvb_closing(kvb_ctx *c);
int kvb_ep_wireup(kvb_ctx *c, kvb_ep *e);
// kvb_ep_detect sets e->emulated when the endpoint has no RMA lane of its
// own (UCX would emulate puts with active messages: tcp) and the peer
// answered the wire-up PING (it handles the write messages); 1 if it did.
int kvb_ep_detect(kvb_ep *e);
int kvb_rkey_unpack(kvb_ep *e, const void *buf, ucp_rkey_h *out);
// kvb_rkey_ptr returns where remote memory is mapped in this process (shared
// memory transports), or 0.
uintptr_t kvb_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr);
// kvb_xfer_copied marks a transfer whose data the caller copied itself into
// mapped peer memory: only the notification remains.
void kvb_xfer_copied(kvb_xfer *x, kvb_ep *e, int has_notif);

int kvb_xfer_start(kvb_ctx *c, kvb_xfer *x, kvb_ep *e, int read, int n, const uint64_t *laddr,
		   const uint64_t *len, const uint64_t *raddr, ucp_rkey_h *rkeys, ucp_mem_h *memhs);
int kvb_xfer_advance(kvb_ctx *c, kvb_xfer *x, const void *hdr, size_t hdr_len, const void *msg,
		     size_t msg_len, int has_notif);
void kvb_xfer_cancel(kvb_ctx *c, kvb_xfer *x);
// kvb_xfer_free frees a transfer whose callbacks have all run
// (outstanding == 0).
void kvb_xfer_free(kvb_ctx *c, kvb_xfer *x);
int kvb_send_notif(kvb_ctx *c, kvb_ep *e, const void *hdr, size_t hdr_len, const void *msg, size_t msg_len);

// kvb_am_raw sends one active message as given, copied, and waits for it
// to leave (GenNotif; tests: a hostile peer).
int kvb_am_raw(kvb_ctx *c, kvb_ep *e, unsigned id, const void *hdr, size_t hdr_len, const void *data, size_t len,
	       unsigned flags);

kvb_notif *kvb_notif_pop(kvb_ctx *c);
void kvb_notif_free(kvb_notif *n);

#endif
