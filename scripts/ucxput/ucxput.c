// ucxput: the same-memory reference of make bench-engine. Two processes,
// one UCP put stream between them, as ucx_perftest -t ucp_put_bw runs it,
// but on the memory kind the row measures: "engine" memory UCX allocates
// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE, what ucx_perftest always uses)
// or "caller" memory the program allocates and registers (posix_memalign,
// then ucp_mem_map of it), the memory an engine's own KV cache is. Both
// sides use the same kind. The target only progresses its worker (puts
// UCX emulates need it), as kvbridge's target does.
//
//   ucxput server PORT SIZE MEM [SLOTS]
//   ucxput client HOST PORT SIZE ITERS MEM [WINDOW [SLOTS [OP]]]   -> "Final: GB/s"
//
// WINDOW is how many puts are in flight at once (default 16): make
// bench-engine gives each row the concurrency of the kvbridge case it is
// the reference of (1 for a write waited for, 8 for 8 in flight). SLOTS
// (default 1; the same on both sides) is how many SIZE-byte slots of one
// buffer the puts go to in turn, as the kvbridge case's writes do: with
// one slot a 1 MiB put rewrites memory that stays in cache.
//
// OP "am" sends each SIZE bytes as a rendezvous active message instead of
// a put, which the target receives into its slot (ucp_am_recv_data_nbx):
// UCX's zero-copy path for memory it did not allocate (cma: the target
// reads the sender's pages with process_vm_readv), measured next to the
// put UCX emulates with two copies through the shared-memory queue. OP
// "flush" follows each put with an endpoint flush and counts the flushes
// as the puts' completions: each put known to have landed, as a kvbridge
// write is when it completes.
//
// Built by scripts/bench-engine.sh against the system's UCX (libucx-dev).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

static long window = 16; // puts in flight

static void die(const char *what, const char *why) {
	fprintf(stderr, "ucxput: %s: %s\n", what, why);
	exit(1);
}

static void check(const char *what, ucs_status_t st) {
	if (st != UCS_OK) die(what, ucs_status_string(st));
}

static void xio(int fd, void *b, size_t n, int out) {
	char *p = b;
	while (n > 0) {
		ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
		if (k <= 0) {
			if (k < 0 && errno == EINTR) continue;
			die(out ? "write" : "read", k < 0 ? strerror(errno) : "peer closed");
		}
		p += k;
		n -= (size_t)k;
	}
}

static void send_blob(int fd, const void *b, uint64_t n) {
	xio(fd, &n, sizeof n, 1);
	xio(fd, (void *)b, n, 1);
}

static void *recv_blob(int fd, uint64_t *n) {
	xio(fd, n, sizeof *n, 0);
	if (*n > (1u << 20)) die("blob", "too large");
	void *b = malloc(*n ? *n : 1);
	xio(fd, b, *n, 0);
	return b;
}

static ucp_context_h ctx;
static ucp_worker_h worker;

static void init(void) {
	ucp_config_t *cfg;
	check("ucp_config_read", ucp_config_read(NULL, NULL, &cfg));
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
	check("ucp_init", ucp_init(&p, cfg, &ctx));
	ucp_config_release(cfg);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
	check("ucp_worker_create", ucp_worker_create(ctx, &wp, &worker));
}

// mem maps size bytes of the kind mem ("engine" or "caller").
static void *mem(const char *kind, size_t size, ucp_mem_h *memh) {
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
				      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
		.length = size};
	if (strcmp(kind, "caller") == 0) {
		void *b;
		if (posix_memalign(&b, 4096, size) != 0) die("posix_memalign", "failed");
		memset(b, 1, size); // touched: the pages exist, as a KV cache's do
		mp.address = b;
	} else if (strcmp(kind, "engine") == 0) {
		mp.address = NULL;
		mp.flags = UCP_MEM_MAP_ALLOCATE;
	} else {
		die("memory", "want engine or caller");
	}
	check("ucp_mem_map", ucp_mem_map(ctx, &mp, memh));
	ucp_mem_attr_t a = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
	check("ucp_mem_query", ucp_mem_query(*memh, &a));
	if (mp.address == NULL) memset(a.address, 1, size);
	return a.address;
}

static long completed;

static void put_done(void *req, ucs_status_t st, void *user) {
	(void)user;
	if (st != UCS_OK) die("put", ucs_status_string(st));
	completed++;
	ucp_request_free(req);
}

#define AM_ID 7

// The target's side of OP "am": the slot offset is the header; a
// rendezvous message is received into the slot (the transport reads it
// from the sender), an eager one copied there.
static char *target_buf;
static size_t target_len;

static void am_recvd(void *req, ucs_status_t st, size_t len, void *user) {
	(void)len;
	(void)user;
	if (st != UCS_OK) die("am receive", ucs_status_string(st));
	ucp_request_free(req);
}

static ucs_status_t am_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
			  const ucp_am_recv_param_t *param) {
	(void)arg;
	uint64_t off;
	if (hdr_len != sizeof off) die("am", "bad header");
	memcpy(&off, hdr, sizeof off);
	if (off > target_len || len > target_len - off) die("am", "outside the buffer");
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.recv_am = am_recvd};
		void *r = ucp_am_recv_data_nbx(worker, data, target_buf + off, len, &rp);
		if (UCS_PTR_IS_ERR(r)) die("ucp_am_recv_data_nbx", ucs_status_string(UCS_PTR_STATUS(r)));
		return UCS_OK;
	}
	memcpy(target_buf + off, data, len);
	return UCS_OK;
}

static void wait_req(void *req, const char *what) {
	if (req == NULL) return;
	if (UCS_PTR_IS_ERR(req)) check(what, UCS_PTR_STATUS(req));
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(worker);
	ucp_request_free(req);
	check(what, st);
}

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
	if ((argc == 5 || argc == 6) && strcmp(argv[1], "server") == 0) {
		size_t size = strtoull(argv[3], NULL, 10);
		long slots = argc == 6 ? atol(argv[5]) : 1;
		if (slots < 1) die("slots", "want at least 1");
		if (size == 0 || size > SIZE_MAX / (size_t)slots) die("size", "SIZE × SLOTS out of range");
		init();
		ucp_mem_h memh;
		void *buf = mem(argv[4], size * slots, &memh);
		target_buf = buf;
		target_len = size * slots;
		ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
					     .id = AM_ID,
					     .cb = am_cb};
		check("ucp_worker_set_am_recv_handler", ucp_worker_set_am_recv_handler(worker, &hp));
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2])), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		if (bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, 1) < 0) die("listen", strerror(errno));
		int fd = accept(ls, NULL, NULL);
		if (fd < 0) die("accept", strerror(errno));
		ucp_address_t *addr;
		size_t alen;
		check("ucp_worker_get_address", ucp_worker_get_address(worker, &addr, &alen));
		send_blob(fd, addr, alen);
		void *rkey;
		size_t rlen;
		check("ucp_rkey_pack", ucp_rkey_pack(ctx, memh, &rkey, &rlen));
		uint64_t raddr = (uint64_t)(uintptr_t)buf;
		xio(fd, &raddr, sizeof raddr, 1);
		uint64_t tlen = (uint64_t)target_len; // the client checks its slots fit
		xio(fd, &tlen, sizeof tlen, 1);
		send_blob(fd, rkey, rlen);
		// The target progresses until the client says it is done.
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		while (poll(&pf, 1, 0) == 0) ucp_worker_progress(worker);
		char c;
		xio(fd, &c, 1, 0);
		xio(fd, &c, 1, 1);
		ucp_rkey_buffer_release(rkey);
		ucp_worker_release_address(worker, addr);
		ucp_mem_unmap(ctx, memh);
		ucp_worker_destroy(worker);
		ucp_cleanup(ctx);
		return 0;
	}
	if (argc < 7 || argc > 10 || strcmp(argv[1], "client") != 0) {
		fprintf(stderr, "usage: ucxput server PORT SIZE MEM [SLOTS] | ucxput client HOST PORT SIZE ITERS MEM [WINDOW [SLOTS [OP]]] (MEM: engine or caller; OP: put, flush or am)\n");
		return 2;
	}
	if (argc >= 8 && (window = atol(argv[7])) < 1) die("window", "want at least 1");
	long slots = argc >= 9 ? atol(argv[8]) : 1;
	if (slots < 1) die("slots", "want at least 1");
	int am = argc == 10 && strcmp(argv[9], "am") == 0;
	int flush = argc == 10 && strcmp(argv[9], "flush") == 0;
	if (argc == 10 && !am && !flush && strcmp(argv[9], "put") != 0) die("op", "want put, flush or am");
	size_t size = strtoull(argv[4], NULL, 10);
	long iters = atol(argv[5]);
	if (size == 0 || size > SIZE_MAX / (size_t)slots) die("size", "SIZE × SLOTS out of range");
	init();
	ucp_mem_h memh;
	char *buf = mem(argv[6], size * slots, &memh);
	uint64_t *offs = calloc(slots, sizeof *offs); // the "am" headers: each slot's offset, never rewritten
	if (offs == NULL) die("calloc", "failed");
	for (long k = 0; k < slots; k++) offs[k] = (uint64_t)k * size;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	inet_pton(AF_INET, argv[2], &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect", strerror(errno));
	uint64_t alen, rlen, raddr;
	void *peer = recv_blob(fd, &alen);
	xio(fd, &raddr, sizeof raddr, 0);
	uint64_t tlen;
	xio(fd, &tlen, sizeof tlen, 0);
	if ((uint64_t)size * (uint64_t)slots > tlen) die("slots", "SIZE × SLOTS is more than the server's buffer");
	void *rkeyb = recv_blob(fd, &rlen);
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = peer};
	ucp_ep_h e;
	check("ucp_ep_create", ucp_ep_create(worker, &ep, &e));
	ucp_rkey_h rkey;
	check("ucp_ep_rkey_unpack", ucp_ep_rkey_unpack(e, rkeyb, &rkey));
	ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = put_done};
	ucp_request_param_t ap = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMH,
				  .cb.send = put_done,
				  .flags = UCP_AM_SEND_FLAG_RNDV,
				  .memh = memh};
	double t0 = 0;
	long warm = iters / 10 + 1;
	long issued = 0;
	for (long i = 0; i < warm + iters; i++) {
		if (i == warm) { // warmed up: drain, then time the rest
			while (completed < issued) ucp_worker_progress(worker);
			t0 = now();
		}
		uint64_t off = (uint64_t)(i % slots) * size;
		void *req;
		if (am) {
			req = ucp_am_send_nbx(e, AM_ID, &offs[i % slots], sizeof offs[0], buf + off, size, &ap);
		} else if (flush) {
			ucp_request_param_t np = {0};
			req = ucp_put_nbx(e, buf + off, size, raddr + off, rkey, &np);
			if (UCS_PTR_IS_ERR(req)) check("ucp_put_nbx", UCS_PTR_STATUS(req));
			if (req != NULL) ucp_request_free(req); // completes with the flush after it
			req = ucp_ep_flush_nbx(e, &rp);
		} else {
			req = ucp_put_nbx(e, buf + off, size, raddr + off, rkey, &rp);
		}
		issued++;
		if (req == NULL) {
			completed++;
		} else if (UCS_PTR_IS_ERR(req)) {
			check("ucp_put_nbx", UCS_PTR_STATUS(req));
		}
		while (issued - completed >= window) ucp_worker_progress(worker);
	}
	while (completed < issued) ucp_worker_progress(worker);
	ucp_request_param_t fp = {0};
	wait_req(ucp_ep_flush_nbx(e, &fp), "ucp_ep_flush_nbx");
	double el = now() - t0;
	printf("Final: %.3f GB/s\n", (double)size * iters / el / 1e9);
	fflush(stdout);
	char c = 'd';
	xio(fd, &c, 1, 1);
	xio(fd, &c, 1, 0);
	ucp_rkey_destroy(rkey);
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *creq = ucp_ep_close_nbx(e, &cp);
	if (creq != NULL && !UCS_PTR_IS_ERR(creq)) {
		while (ucp_request_check_status(creq) == UCS_INPROGRESS) ucp_worker_progress(worker);
		ucp_request_free(creq);
	}
	ucp_mem_unmap(ctx, memh);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	free(peer);
	free(rkeyb);
	free(offs);
	return 0;
}
