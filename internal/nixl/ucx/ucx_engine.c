#define _GNU_SOURCE // process_vm_readv
#include "ucx_engine.h"

#include "kvb_dl.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

kvbu_api kvbu;

static const kvb_dl_sym ucp_syms[] = {
	KVB_DL_SYM(kvbu_api, ucp_get_version, "ucp_get_version", 1),
	KVB_DL_SYM(kvbu_api, ucp_config_read, "ucp_config_read", 1),
	KVB_DL_SYM(kvbu_api, ucp_config_modify, "ucp_config_modify", 1),
	KVB_DL_SYM(kvbu_api, ucp_config_release, "ucp_config_release", 1),
	KVB_DL_SYM(kvbu_api, ucp_init_version, "ucp_init_version", 1),
	KVB_DL_SYM(kvbu_api, ucp_cleanup, "ucp_cleanup", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_create, "ucp_worker_create", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_destroy, "ucp_worker_destroy", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_get_address, "ucp_worker_get_address", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_release_address, "ucp_worker_release_address", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_progress, "ucp_worker_progress", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_get_efd, "ucp_worker_get_efd", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_arm, "ucp_worker_arm", 1),
	KVB_DL_SYM(kvbu_api, ucp_worker_set_am_recv_handler, "ucp_worker_set_am_recv_handler", 1),
	KVB_DL_SYM(kvbu_api, ucp_ep_create, "ucp_ep_create", 1),
	KVB_DL_SYM(kvbu_api, ucp_ep_close_nbx, "ucp_ep_close_nbx", 1),
	KVB_DL_SYM(kvbu_api, ucp_ep_flush_nbx, "ucp_ep_flush_nbx", 1),
	KVB_DL_SYM(kvbu_api, ucp_ep_rkey_unpack, "ucp_ep_rkey_unpack", 1),
	KVB_DL_SYM(kvbu_api, ucp_ep_print_info, "ucp_ep_print_info", 1),
	KVB_DL_SYM(kvbu_api, ucp_put_nbx, "ucp_put_nbx", 1),
	KVB_DL_SYM(kvbu_api, ucp_get_nbx, "ucp_get_nbx", 1),
	KVB_DL_SYM(kvbu_api, ucp_am_send_nbx, "ucp_am_send_nbx", 1),
	KVB_DL_SYM(kvbu_api, ucp_mem_map, "ucp_mem_map", 1),
	KVB_DL_SYM(kvbu_api, ucp_mem_unmap, "ucp_mem_unmap", 1),
	KVB_DL_SYM(kvbu_api, ucp_mem_query, "ucp_mem_query", 1),
	KVB_DL_SYM(kvbu_api, ucp_rkey_pack, "ucp_rkey_pack", 1),
	KVB_DL_SYM(kvbu_api, ucp_rkey_buffer_release, "ucp_rkey_buffer_release", 1),
	KVB_DL_SYM(kvbu_api, ucp_rkey_ptr, "ucp_rkey_ptr", 1),
	KVB_DL_SYM(kvbu_api, ucp_rkey_destroy, "ucp_rkey_destroy", 1),
	KVB_DL_SYM(kvbu_api, ucp_request_check_status, "ucp_request_check_status", 1),
	KVB_DL_SYM(kvbu_api, ucp_request_cancel, "ucp_request_cancel", 1),
	KVB_DL_SYM(kvbu_api, ucp_request_free, "ucp_request_free", 1),
	KVB_DL_SYM(kvbu_api, ucs_status_string, "ucs_status_string", 1),
};

int kvbu_load(const char *path, char *err, size_t errlen)
{
	void *h = kvb_dl_open(path, RTLD_NOW | RTLD_GLOBAL, err, errlen);
	if (h == NULL) {
		return -1;
	}
	kvbu_api api;
	const char *missing = kvb_dl_bind(h, &api, ucp_syms, KVB_DL_LEN(ucp_syms));
	if (missing != NULL) {
		snprintf(err, errlen, "%s has no %s: not a UCX 1.x libucp", path, missing);
		dlclose(h);
		return -1;
	}
	unsigned major, minor, release;
	api.ucp_get_version(&major, &minor, &release);
	if (major != 1 || minor < 13) {
		snprintf(err, errlen, "%s is UCX %u.%u.%u: the ucx engine needs UCX 1.13 or newer (1.x)", path, major,
			 minor, release);
		dlclose(h);
		return -1;
	}
	kvbu = api;
	return 0;
}

static ucs_status_t kvb_am_cb(void *arg, const void *header, size_t header_length, void *data,
			      size_t length, const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		return UCS_OK; // notifications are always sent eager; drop anything else
	}
	kvb_notif *n = calloc(1, sizeof(*n));
	if (n == NULL) {
		return UCS_OK;
	}
	n->name = malloc(header_length + 1);
	n->data = malloc(length + 1);
	if (n->name == NULL || n->data == NULL) {
		kvb_notif_free(n);
		return UCS_OK;
	}
	memcpy(n->name, header, header_length);
	n->name_len = header_length;
	memcpy(n->data, data, length);
	n->data_len = length;
	if (c->tail) {
		c->tail->next = n;
	} else {
		c->head = n;
	}
	c->tail = n;
	return UCS_OK;
}

// kvb_region_covers: [addr, addr+len) lies inside one mapped host region.
static int kvb_region_covers(kvb_ctx *c, uint64_t addr, size_t len)
{
	for (size_t i = 0; i < c->nregions; i++) {
		kvb_region *r = &c->regions[i];
		if (len <= r->len && addr >= r->addr && addr - r->addr <= r->len - len) {
			return 1;
		}
	}
	return 0;
}

// kvb_copy copies n bytes from or into memory this worker mapped (a
// peer's write or read): through the kernel (process_vm_readv on this
// process), so memory the application made inaccessible since it
// registered it (unmapped, PROT_NONE) fails the copy — 0 — instead of
// killing the process in a UCX thread (seen: SIGSEGV in kvb_write_cb).
// Where the call is not allowed (a seccomp filter), memcpy.
static int kvb_copy(void *to, const void *from, size_t n)
{
	if (n == 0) {
		return 1;
	}
	struct iovec lv = {to, n}, rv = {(void *)from, n};
	ssize_t got = process_vm_readv(getpid(), &lv, 1, &rv, 1, 0);
	if (got == (ssize_t)n) {
		return 1;
	}
	if (got < 0 && (errno == ENOSYS || errno == EPERM)) {
		memcpy(to, from, n);
		return 1;
	}
	return 0;
}

// kvb_free_cb frees a send's malloc'd buffer and its request.
static void kvb_free_cb(void *req, ucs_status_t status, void *user)
{
	(void)status;
	free(user);
	kvbu.ucp_request_free(req);
}

// kvb_reply sends buf (malloc'd, header only) to ep eagerly and frees it
// once sent; a failed send (a peer gone) only drops it.
static void kvb_reply(ucp_ep_h ep, unsigned id, void *buf, size_t len)
{
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = kvb_free_cb;
	p.user_data = buf;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(ep, id, buf, len, NULL, 0, &p);
	if (!UCS_PTR_IS_PTR(r)) {
		free(buf); // sent at once, or failed: no callback comes
	}
}

// kvb_write_cb is the target's side of an active-message write: the
// payload lands only inside mapped host memory, then the sender gets an
// ack through the reply endpoint. Every send here is an active message,
// whose failure (a sender gone) completes its request with an error: UCX's
// own put emulation sends its ack with ucp_request_send, which aborts the
// process on that error.
static ucs_status_t kvb_write_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				 const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	kvb_whdr h;
	if (header_length != sizeof(h) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
	    param->reply_ep == NULL) {
		c->writes_refused++; // no token or nowhere to answer: dropped
		return UCS_OK;
	}
	memcpy(&h, header, sizeof(h));
	kvb_wack *ack = malloc(sizeof(*ack));
	if (ack == NULL) {
		c->writes_refused++;
		return UCS_OK;
	}
	ack->token = h.token;
	ack->len = length;
	ack->status = UCS_OK;
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		ack->status = UCS_ERR_UNSUPPORTED; // writes come eager; a rendezvous is not received
	} else if (!kvb_region_covers(c, h.addr, length)) {
		ack->status = UCS_ERR_INVALID_ADDR; // not memory this worker mapped
	} else if (!kvb_copy((void *)(uintptr_t)h.addr, data, length)) {
		ack->status = UCS_ERR_INVALID_ADDR; // mapped once, not any more
	}
	if (ack->status != UCS_OK) {
		c->writes_refused++;
	}
	kvb_reply(param->reply_ep, KVB_AM_WACK, ack, sizeof(*ack));
	return UCS_OK;
}

// kvb_am_raw_reply sends a copy of an answer as given (tests'
// test_bad_answers), freed once sent.
static void kvb_am_raw_reply(ucp_ep_h ep, const void *hdr, size_t hdr_len, const void *data, size_t len)
{
	char *block = malloc(hdr_len + len);
	if (block == NULL) {
		return;
	}
	memcpy(block, hdr, hdr_len);
	memcpy(block + hdr_len, data, len);
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = kvb_free_cb;
	p.user_data = block;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(ep, KVB_AM_RDATA, block, hdr_len, block + hdr_len, len, &p);
	if (!UCS_PTR_IS_PTR(r)) {
		free(block);
	}
}

// kvb_rblock heads an answer's buffer: what it counts in rdata_pending.
typedef struct kvb_rblock {
	kvb_ctx *c;
	size_t n;
} kvb_rblock;

static void kvb_rblock_free(kvb_rblock *b)
{
	b->c->rdata_pending -= b->n;
	free(b);
}

static void kvb_rdata_sent_cb(void *req, ucs_status_t status, void *user)
{
	(void)status;
	kvb_rblock_free(user);
	kvbu.ucp_request_free(req);
}

// kvb_read_cb is the target's side of an active-message read: it answers
// with the bytes asked for only when they lie inside mapped host memory
// and its queued answers stay under KVB_RDATA_PENDING, else with a
// refusal, through the reply endpoint.
static ucs_status_t kvb_read_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	(void)data;
	kvb_rhdr h;
	if (header_length != sizeof(h) || length != 0 || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
	    param->reply_ep == NULL || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
		c->writes_refused++; // malformed or nowhere to answer: dropped
		return UCS_OK;
	}
	memcpy(&h, header, sizeof(h));
	ucs_status_t st = UCS_OK;
	if (h.len > KVB_AM_CHUNK || !kvb_region_covers(c, h.addr, h.len)) {
		st = UCS_ERR_INVALID_ADDR; // not memory this worker mapped
	} else if (c->rdata_pending + h.len > KVB_RDATA_PENDING) {
		st = UCS_ERR_BUSY; // the reader does not take its answers
	}
	size_t n = st == UCS_OK ? h.len : 0;
	kvb_rblock *b = malloc(sizeof(kvb_rblock) + sizeof(kvb_rdata) + n + 1);
	if (b == NULL) {
		c->writes_refused++;
		return UCS_OK;
	}
	b->c = c;
	b->n = n;
	c->rdata_pending += n;
	char *block = (char *)(b + 1);
	kvb_rdata a = {h.token, h.index, st};
	memcpy(block, &a, sizeof(a));
	if (n > 0 && !kvb_copy(block + sizeof(a), (void *)(uintptr_t)h.addr, n)) {
		// Mapped once, not any more: refused (the block is sent as a
		// refusal, its bytes not counted as pending).
		c->rdata_pending -= n;
		b->n = 0;
		n = 0;
		st = UCS_ERR_INVALID_ADDR;
		memcpy(block, &(kvb_rdata){h.token, h.index, st}, sizeof(a));
	}
	if (st != UCS_OK) {
		c->writes_refused++;
	}
	if ((c->test_bad_answers == 2 || c->test_bad_answers == 4) && n > 0) {
		uint64_t ahead = c->test_bad_answers == 2 ? 1000 : 2 * KVB_READ_WINDOW;
		kvb_rdata bad = {h.token, h.index + ahead, UCS_OK};
		kvb_am_raw_reply(param->reply_ep, &bad, sizeof(bad), block + sizeof(a), n);
	}
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = kvb_rdata_sent_cb;
	p.user_data = b;
	size_t sent = c->test_bad_answers == 3 && n > 0 ? n - 1 : n;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(param->reply_ep, KVB_AM_RDATA, block, sizeof(a), block + sizeof(a), sent, &p);
	if (!UCS_PTR_IS_PTR(r)) {
		kvb_rblock_free(b); // sent at once, or failed (the reader gone): no callback comes
	}
	if (c->test_bad_answers == 1 && n > 0) {
		char *other = malloc(n);
		if (other != NULL) {
			memset(other, 0xee, n);
			kvb_am_raw_reply(param->reply_ep, &a, sizeof(a), other, n);
			free(other);
		}
	}
	return UCS_OK;
}

// kvb_block_sent_cb frees a send's copied buffers; the request is freed by
// whoever waits on it (ucp_request_free before completion releases it
// after this callback).
static void kvb_block_sent_cb(void *req, ucs_status_t status, void *user)
{
	(void)req;
	(void)status;
	free(user);
}

// kvb_ping_cb answers a PING with a PONG carrying its token. The answer
// leaves after this side's wire-up reply, which sits in the same lane's
// pending queue while the connection back is being made: once the pinger
// has its PONG, no wire-up message of this side is pending (UCX 1.13
// asserts in ucp_request_send_state_ff, aborting the process, when a peer
// dies while one is — seen as the target of a writer killed right after
// connecting).
static ucs_status_t kvb_ping_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	(void)data;
	(void)length;
	if (c->no_pong || header_length != sizeof(uint64_t) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
	    param->reply_ep == NULL) {
		return UCS_OK;
	}
	uint64_t *tok = malloc(sizeof(*tok));
	if (tok == NULL) {
		return UCS_OK;
	}
	memcpy(tok, header, sizeof(*tok));
	kvb_reply(param->reply_ep, KVB_AM_PONG, tok, sizeof(*tok));
	return UCS_OK;
}

static ucs_status_t kvb_pong_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	(void)data;
	(void)length;
	(void)param;
	uint64_t tok;
	if (header_length == sizeof(tok)) {
		memcpy(&tok, header, sizeof(tok));
		if (tok != 0 && tok == c->ping_token) {
			c->pong_seen = 1;
		}
	}
	return UCS_OK;
}

static void kvb_amx_unlink(kvb_ctx *c, kvb_xfer *x)
{
	for (kvb_xfer **pp = &c->amx; *pp != NULL; pp = &(*pp)->amnext) {
		if (*pp == x) {
			*pp = x->amnext;
			x->amnext = NULL;
			return;
		}
	}
}

// kvb_amx_find is the message transfer in flight with this token, or NULL.
static kvb_xfer *kvb_amx_find(kvb_ctx *c, uint64_t token)
{
	kvb_xfer *x = c->amx;
	while (x != NULL && x->token != token) {
		x = x->amnext;
	}
	return x;
}

// kvb_wack_cb is the sender's side: an ack counts towards its transfer when
// it comes through that transfer's endpoint and does not exceed what was
// sent; a refusal fails the transfer.
static ucs_status_t kvb_wack_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	(void)data;
	(void)length;
	kvb_wack a;
	if (header_length != sizeof(a)) {
		c->acks_unknown++;
		return UCS_OK;
	}
	memcpy(&a, header, sizeof(a));
	kvb_xfer *x = kvb_amx_find(c, a.token);
	if (x == NULL || x->am_read || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
	    param->reply_ep != x->ep->ep) {
		c->acks_unknown++;
		return UCS_OK;
	}
	if (a.status != UCS_OK) {
		if (x->am_wstatus == UCS_OK) {
			x->am_wstatus = a.status < UCS_ERR_LAST || a.status >= 0 ? UCS_ERR_IO_ERROR : (ucs_status_t)a.status;
		}
	} else if (a.len > x->am_total - x->am_acked) {
		if (x->am_wstatus == UCS_OK) {
			x->am_wstatus = UCS_ERR_MESSAGE_TRUNCATED; // more acknowledged than sent
		}
	} else {
		x->am_acked += a.len;
	}
	return UCS_OK;
}

static int kvb_read_ask(kvb_ctx *c, kvb_xfer *x);

// kvb_rdata_cb is the reader's side: an answer lands in its chunk's
// destination when it comes through that transfer's endpoint, for a chunk
// requested and not answered yet, with exactly the bytes asked for; a
// refusal fails the transfer. Each answer sends the read's next request.
static ucs_status_t kvb_rdata_cb(void *arg, const void *header, size_t header_length, void *data, size_t length,
				 const ucp_am_recv_param_t *param)
{
	kvb_ctx *c = arg;
	kvb_rdata a;
	if (header_length != sizeof(a)) {
		c->acks_unknown++;
		return UCS_OK;
	}
	memcpy(&a, header, sizeof(a));
	kvb_xfer *x = kvb_amx_find(c, a.token);
	if (x == NULL || !x->am_read || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
	    param->reply_ep != x->ep->ep || a.index >= x->rsent || x->rgot[a.index]) {
		c->acks_unknown++;
		return UCS_OK;
	}
	x->rgot[a.index] = 1;
	x->ranswered++;
	if (x->am_wstatus != UCS_OK) {
		return UCS_OK;
	}
	if (a.status != UCS_OK) {
		x->am_wstatus = a.status < UCS_ERR_LAST || a.status >= 0 ? UCS_ERR_IO_ERROR : (ucs_status_t)a.status;
	} else if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length != x->rhdrs[a.index].len) {
		x->am_wstatus = UCS_ERR_MESSAGE_TRUNCATED; // not the bytes asked for
	} else {
		if (length > 0) {
			memcpy((void *)(uintptr_t)x->rdst[a.index], data, length);
		}
		x->am_acked += length;
		// One answer in: the next chunk's request goes out.
		if (x->rsent < x->rchunks && !x->ep->failed) {
			kvb_read_ask(c, x);
		}
	}
	return UCS_OK;
}

int kvb_init(kvb_ctx **out, const char **keys, const char **vals, int n, char *err, size_t errlen)
{
	ucp_config_t *cfg;
	ucs_status_t st = kvbu.ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_config_read: %s", kvbu.ucs_status_string(st));
		return st;
	}
	for (int i = 0; i < n; i++) {
		st = kvbu.ucp_config_modify(cfg, keys[i], vals[i]);
		if (st != UCS_OK) {
			snprintf(err, errlen, "kvbu.ucp_config_modify(%s=%s): %s", keys[i], vals[i], kvbu.ucs_status_string(st));
			kvbu.ucp_config_release(cfg);
			return st;
		}
	}
	kvb_ctx *c = calloc(1, sizeof(*c));
	ucp_params_t p = {0};
	p.field_mask = UCP_PARAM_FIELD_FEATURES;
	// WAKEUP: the worker's event fd (kvb_efd, kvb_arm) lets the progress
	// goroutine sleep until traffic arrives instead of polling.
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
	st = kvbu.ucp_init_version(1, 13, &p, cfg, &c->ctx);
	kvbu.ucp_config_release(cfg);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_init: %s", kvbu.ucs_status_string(st));
		free(c);
		return st;
	}
	ucp_worker_params_t wp = {0};
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
	st = kvbu.ucp_worker_create(c->ctx, &wp, &c->worker);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_create: %s", kvbu.ucs_status_string(st));
		kvbu.ucp_cleanup(c->ctx);
		free(c);
		return st;
	}
	static const struct {
		unsigned id;
		ucp_am_recv_callback_t cb;
	} handlers[] = {{KVB_AM_NOTIF, kvb_am_cb},
			{KVB_AM_WRITE, kvb_write_cb},
			{KVB_AM_WACK, kvb_wack_cb},
			{KVB_AM_PING, kvb_ping_cb},
			{KVB_AM_PONG, kvb_pong_cb},
			{KVB_AM_READ, kvb_read_cb},
			{KVB_AM_RDATA, kvb_rdata_cb}};
	ucp_am_handler_param_t hp = {0};
	hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG;
	hp.arg = c;
	for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]) && st == UCS_OK; i++) {
		hp.id = handlers[i].id;
		hp.cb = handlers[i].cb;
		st = kvbu.ucp_worker_set_am_recv_handler(c->worker, &hp);
	}
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_worker_set_am_recv_handler: %s", kvbu.ucs_status_string(st));
		kvbu.ucp_worker_destroy(c->worker);
		kvbu.ucp_cleanup(c->ctx);
		free(c);
		return st;
	}
	*out = c;
	return UCS_OK;
}

void kvb_destroy(kvb_ctx *c)
{
	kvb_notif *n;
	while ((n = kvb_notif_pop(c)) != NULL) {
		kvb_notif_free(n);
	}
	for (kvb_ep *e = c->closed; e != NULL; e = e->next_closed) {
		kvbu.ucp_request_free(e->close_req); // released when the worker ends it
	}
	kvbu.ucp_worker_destroy(c->worker);
	while (c->closed != NULL) { // their closes ended with the worker
		kvb_ep *e = c->closed;
		c->closed = e->next_closed;
		free(e);
	}
	free(c->regions);
	kvbu.ucp_cleanup(c->ctx);
	free(c);
}

int kvb_worker_address(kvb_ctx *c, void **addr, size_t *len)
{
	ucp_address_t *a;
	ucs_status_t st = kvbu.ucp_worker_get_address(c->worker, &a, len);
	if (st != UCS_OK) {
		return st;
	}
	*addr = malloc(*len);
	memcpy(*addr, a, *len);
	kvbu.ucp_worker_release_address(c->worker, a);
	return UCS_OK;
}

unsigned kvb_progress(kvb_ctx *c)
{
	unsigned total = 0, n;
	int rounds = 0;
	while ((n = kvbu.ucp_worker_progress(c->worker)) > 0 && rounds++ < 64) {
		total += n;
	}
	kvb_closing(c);
	return total;
}

int kvb_efd(kvb_ctx *c, int *fd) { return kvbu.ucp_worker_get_efd(c->worker, fd); }

int kvb_arm(kvb_ctx *c) { return kvbu.ucp_worker_arm(c->worker); }

char *kvb_ptr(uintptr_t addr) { return (char *)addr; }

int kvb_mem_map(kvb_ctx *c, uintptr_t addr, size_t len, int allocate, ucp_mem_h *memh, uintptr_t *out_addr,
		void **rkey, size_t *rkey_len)
{
	ucp_mem_map_params_t p = {0};
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
		       UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.address = allocate ? NULL : (void *)addr;
	p.length = len;
	p.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
	ucs_status_t st = kvbu.ucp_mem_map(c->ctx, &p, memh);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t attr = {0};
	attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	st = kvbu.ucp_mem_query(*memh, &attr);
	if (st != UCS_OK) {
		kvbu.ucp_mem_unmap(c->ctx, *memh);
		return st;
	}
	*out_addr = (uintptr_t)attr.address;
	void *buf;
	st = kvbu.ucp_rkey_pack(c->ctx, *memh, &buf, rkey_len);
	if (st != UCS_OK) {
		kvbu.ucp_mem_unmap(c->ctx, *memh);
		return st;
	}
	if (c->nregions == c->capregions) {
		size_t cap = c->capregions ? 2 * c->capregions : 16;
		kvb_region *r = realloc(c->regions, cap * sizeof(*r));
		if (r == NULL) {
			kvbu.ucp_rkey_buffer_release(buf);
			kvbu.ucp_mem_unmap(c->ctx, *memh);
			return UCS_ERR_NO_MEMORY;
		}
		c->regions = r;
		c->capregions = cap;
	}
	c->regions[c->nregions++] = (kvb_region){*memh, (uintptr_t)attr.address, len};
	*rkey = malloc(*rkey_len);
	memcpy(*rkey, buf, *rkey_len);
	kvbu.ucp_rkey_buffer_release(buf);
	return UCS_OK;
}

// kvb_mem_unmap also takes the region out of those an active-message write
// may land in: a write arriving after it is refused.
void kvb_mem_unmap(kvb_ctx *c, ucp_mem_h memh)
{
	for (size_t i = 0; i < c->nregions; i++) {
		if (c->regions[i].memh == memh) {
			c->regions[i] = c->regions[--c->nregions];
			break;
		}
	}
	kvbu.ucp_mem_unmap(c->ctx, memh);
}

static void kvb_ep_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	kvb_ep *e = arg;
	(void)ep;
	e->failed = 1;
	e->status = status;
}

int kvb_ep_create(kvb_ctx *c, const void *addr, int peer_errors, kvb_ep **out)
{
	kvb_ep *e = calloc(1, sizeof(*e));
	ucp_ep_params_t p = {0};
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		       UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = addr;
	// Shared-memory-only transports cannot detect peer failure, and UCX
	// refuses them in peer mode; there the agent's deadline bounds a
	// transfer to a dead peer.
	p.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	p.err_handler.cb = kvb_ep_err;
	p.err_handler.arg = e;
	ucs_status_t st = kvbu.ucp_ep_create(c->worker, &p, &e->ep);
	if (st != UCS_OK) {
		free(e);
		return st;
	}
	*out = e;
	return UCS_OK;
}

static long kvb_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

// KVB_PING_WAIT_MS bounds the PING round trip: a peer that does not answer
// (a kvbridge older than the PING) costs a connection this once.
#define KVB_PING_WAIT_MS 1000

// kvb_ep_ping makes one PING/PONG round trip (see kvb_ping_cb), bounded by
// time. Its PONG also proves the peer handles kvbridge's write messages, so
// only then does kvb_ep_detect send writes as messages: a peer that does
// not answer (an older build) gets puts, as before. Each PING carries a
// token of its own, freed when its send completes (a PING given up on may
// still be queued: it must not answer for a later one).
static int kvb_ep_ping(kvb_ctx *c, kvb_ep *e)
{
	uint64_t *tok = malloc(sizeof(*tok));
	if (tok == NULL) {
		return UCS_OK; // not known to be settled; not an error
	}
	*tok = c->ping_token = ++c->next_token;
	c->pong_seen = 0;
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = kvb_free_cb;
	p.user_data = tok;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(e->ep, KVB_AM_PING, tok, sizeof(*tok), NULL, 0, &p);
	if (!UCS_PTR_IS_PTR(r)) {
		free(tok); // sent at once, or failed: no callback comes
		if (UCS_PTR_IS_ERR(r)) {
			return UCS_PTR_STATUS(r);
		}
	}
	long deadline = kvb_now_ms() + KVB_PING_WAIT_MS;
	while (!c->pong_seen && !e->failed && kvb_now_ms() < deadline) {
		kvbu.ucp_worker_progress(c->worker);
	}
	e->answered = c->pong_seen;
	c->ping_token = 0;
	return e->failed ? e->status : UCS_OK;
}

// kvb_ep_lanes reports whether the endpoint has lanes at all and a lane
// that moves puts itself (UCX prints each lane's roles: "rma_bw#" marks
// RDMA, cma, ...; with none, UCX emulates puts over its active-message
// lane).
static void kvb_ep_lanes(kvb_ep *e, int *lanes, int *rma)
{
	char *buf = NULL;
	size_t n = 0;
	*lanes = *rma = 0;
	FILE *f = open_memstream(&buf, &n);
	if (f == NULL) {
		return;
	}
	kvbu.ucp_ep_print_info(e->ep, f);
	fclose(f);
	*lanes = buf != NULL && strstr(buf, "lane[") != NULL;
	*rma = buf != NULL && strstr(buf, "rma_bw#") != NULL;
	free(buf);
}

// kvb_ep_ping_emulated pings an endpoint whose puts UCX would emulate: its
// PONG is what lets writes go as kvbridge's messages (kvb_ep_detect). One
// with a put lane of its own (shared memory, RDMA) is not pinged: the
// PING's reply endpoint makes the peer connect back, and UCX 1.13 destroys
// an endpoint whose peer connected back only once that peer closes its
// side too — one to a process that died (over shared memory, where UCX
// cannot force a close) would stay, its segments mapped here, for good.
static int kvb_ep_ping_emulated(kvb_ctx *c, kvb_ep *e)
{
	int lanes, rma;
	kvb_ep_lanes(e, &lanes, &rma);
	if (rma) {
		return e->failed ? e->status : UCS_OK;
	}
	return kvb_ep_ping(c, e);
}

// kvb_ep_wireup flushes a new endpoint so its connection is established
// while both sides are known alive (UCX 1.13 aborts the process if a peer
// dies while a wireup reply is still pending), then pings it if its puts
// are emulated (kvb_ep_ping_emulated). Bounded; returns the status.
int kvb_ep_wireup(kvb_ctx *c, kvb_ep *e)
{
	ucp_request_param_t p = {0};
	void *req = kvbu.ucp_ep_flush_nbx(e->ep, &p);
	if (req == NULL) {
		return kvb_ep_ping_emulated(c, e);
	}
	if (UCS_PTR_IS_ERR(req)) {
		return UCS_PTR_STATUS(req);
	}
	ucs_status_t st;
	for (int i = 0; i < 2000000 && (st = kvbu.ucp_request_check_status(req)) == UCS_INPROGRESS; i++) {
		kvbu.ucp_worker_progress(c->worker);
	}
	if (st == UCS_INPROGRESS) {
		kvbu.ucp_request_cancel(c->worker, req);
		kvbu.ucp_worker_progress(c->worker);
		st = UCS_ERR_TIMED_OUT;
	}
	kvbu.ucp_request_free(req);
	return st == UCS_OK ? kvb_ep_ping_emulated(c, e) : st;
}

// kvb_ep_detect: with no put lane of its own, UCX emulates puts over its
// active-message lane; only a peer that answered the PING (the same write
// messages) gets kvbridge's write messages instead.
int kvb_ep_detect(kvb_ep *e)
{
	int lanes, rma;
	kvb_ep_lanes(e, &lanes, &rma);
	e->emulated = e->answered && lanes && !rma;
	return e->emulated;
}

// kvb_ep_close starts closing an endpoint and returns at once: flushing
// when it has not failed, so the writes in flight land and the peer sees a
// clean disconnect. A put over tcp is emulated with active messages, and a
// peer that handles one after this side's socket closed aborts its process
// in UCX (ucp_put_handler sends its completion through ucp_request_send,
// which calls ucs_fatal on the send error; UCX 1.13 to 1.22): so the close
// is not cut short by a count of progress calls, and the worker is not
// destroyed under it (kvb_closing). kvb_progress finishes it; after
// wait_ms it is left to UCX (a second ucp_ep_close_nbx on the endpoint is
// an error) and ends with the worker. e is freed once its close is done,
// or with the worker: until then UCX may call its error handler with it.
void kvb_ep_close(kvb_ctx *c, kvb_ep *e, unsigned wait_ms)
{
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = e->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	void *req = kvbu.ucp_ep_close_nbx(e->ep, &p);
	if (!UCS_PTR_IS_PTR(req)) {
		free(e); // closed (or refused) at once: no callback comes
		return;
	}
	e->close_req = req;
	e->close_deadline_ms = kvb_now_ms() + wait_ms;
	e->next_closed = c->closed;
	c->closed = e;
	c->closing++;
}

// kvb_closing settles the closes that finished or ran past their bound and
// returns how many are still in progress.
unsigned kvb_closing(kvb_ctx *c)
{
	if (c->closed == NULL) {
		return 0;
	}
	long now = kvb_now_ms();
	for (kvb_ep **pp = &c->closed; *pp != NULL;) {
		kvb_ep *e = *pp;
		int done = kvbu.ucp_request_check_status(e->close_req) != UCS_INPROGRESS;
		if (!done && (e->abandoned || now < e->close_deadline_ms)) {
			pp = &e->next_closed;
			continue;
		}
		if (!done) {
			// Past its bound: no longer waited for (Close may destroy the
			// worker), still settled here if it ends.
			e->abandoned = 1;
			c->closing--;
			pp = &e->next_closed;
			continue;
		}
		kvbu.ucp_request_free(e->close_req);
		if (!e->abandoned) {
			c->closing--;
		}
		*pp = e->next_closed;
		free(e);
	}
	return c->closing;
}

int kvb_rkey_unpack(kvb_ep *e, const void *buf, ucp_rkey_h *out) { return kvbu.ucp_ep_rkey_unpack(e->ep, buf, out); }

uintptr_t kvb_rkey_ptr(ucp_rkey_h rkey, uint64_t raddr)
{
	void *p;
	return kvbu.ucp_rkey_ptr(rkey, raddr, &p) == UCS_OK ? (uintptr_t)p : 0;
}

void kvb_xfer_copied(kvb_xfer *x, kvb_ep *e, int has_notif)
{
	x->ep = e;
	x->status = UCS_OK;
	x->flush_done = 0;
	x->am_done = 0;
	x->am_write = 0;
	x->am_read = 0;
	x->stage = e->failed ? KVB_XFER_FAILED : has_notif ? KVB_XFER_NOTIFY : KVB_XFER_DONE;
}

static void kvb_flush_cb(void *req, ucs_status_t status, void *user)
{
	kvb_xfer *x = user;
	x->flush_done = 1;
	x->flush_status = status;
	x->flush_req = NULL;
	x->outstanding--;
	kvbu.ucp_request_free(req);
}

static void kvb_am_sent_cb(void *req, ucs_status_t status, void *user)
{
	kvb_xfer *x = user;
	x->am_done = 1;
	x->am_status = status;
	x->am_req = NULL;
	x->outstanding--;
	kvbu.ucp_request_free(req);
}

static void kvb_fail(kvb_xfer *x, ucs_status_t st)
{
	x->stage = KVB_XFER_FAILED;
	x->status = st;
}

static void kvb_wsent_cb(void *req, ucs_status_t status, void *user)
{
	kvb_xfer *x = user;
	if (status != UCS_OK && x->am_wstatus == UCS_OK) {
		x->am_wstatus = status;
	}
	x->outstanding--;
	kvbu.ucp_request_free(req);
}

// kvb_am_took takes the request of one of a message transfer's sends: it
// counts one in flight, or fails the transfer and unlinks it (returns 0).
static int kvb_am_took(kvb_ctx *c, kvb_xfer *x, ucs_status_ptr_t r)
{
	if (UCS_PTR_IS_ERR(r)) {
		kvb_fail(x, UCS_PTR_STATUS(r));
		kvb_amx_unlink(c, x);
		return 0;
	}
	if (r != NULL) {
		x->outstanding++;
	}
	return 1;
}

// kvb_am_begin counts a message transfer's chunks of at most KVB_AM_CHUNK
// bytes and its bytes; 0 (the transfer failed busy) while the last post's
// sends still read its headers.
static int kvb_am_begin(kvb_xfer *x, int n, const uint64_t *len, size_t *chunks, uint64_t *total)
{
	if (x->outstanding > 0) {
		kvb_fail(x, UCS_ERR_BUSY);
		return 0;
	}
	*chunks = 0;
	*total = 0;
	for (int i = 0; i < n; i++) {
		*chunks += (len[i] + KVB_AM_CHUNK - 1) / KVB_AM_CHUNK;
		*total += len[i];
	}
	return 1;
}

// kvb_xfer_start_am sends a write as KVB_AM_WRITE messages of at most
// KVB_AM_CHUNK bytes; it is complete when the target acknowledged every
// byte (kvb_wack_cb), which is after the target copied it.
static int kvb_xfer_start_am(kvb_ctx *c, kvb_xfer *x, kvb_ep *e, int n, const uint64_t *laddr, const uint64_t *len,
			     const uint64_t *raddr, ucp_mem_h *memhs)
{
	size_t chunks;
	uint64_t total;
	if (!kvb_am_begin(x, n, len, &chunks, &total)) {
		return x->stage;
	}
	free(x->whdrs);
	x->whdrs = chunks ? malloc(chunks * sizeof(kvb_whdr)) : NULL;
	if (chunks && x->whdrs == NULL) {
		kvb_fail(x, UCS_ERR_NO_MEMORY);
		return x->stage;
	}
	x->am_write = 1;
	x->token = ++c->next_token;
	x->am_total = total;
	x->am_acked = 0;
	x->am_wstatus = UCS_OK;
	x->amnext = c->amx;
	c->amx = x;
	size_t k = 0;
	for (int i = 0; i < n; i++) {
		for (uint64_t off = 0; off < len[i]; off += KVB_AM_CHUNK, k++) {
			uint64_t m = len[i] - off < KVB_AM_CHUNK ? len[i] - off : KVB_AM_CHUNK;
			x->whdrs[k] = (kvb_whdr){x->token, raddr[i] + off};
			ucp_request_param_t p = {0};
			p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
			p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
			p.cb.send = kvb_wsent_cb;
			p.user_data = x;
			if (memhs[i] != NULL) {
				p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
				p.memh = memhs[i];
			}
			ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(e->ep, KVB_AM_WRITE, &x->whdrs[k], sizeof(kvb_whdr),
								  (void *)(uintptr_t)(laddr[i] + off), m, &p);
			if (!kvb_am_took(c, x, r)) {
				return x->stage;
			}
		}
	}
	return x->stage;
}

// kvb_read_ask sends a read's next chunk request (x->rsent); 0 when the
// send failed (the transfer failed and is unlinked).
static int kvb_read_ask(kvb_ctx *c, kvb_xfer *x)
{
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = kvb_wsent_cb;
	p.user_data = x;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(x->ep->ep, KVB_AM_READ, &x->rhdrs[x->rsent], sizeof(kvb_rhdr), NULL, 0, &p);
	x->rsent++;
	if (x->rsent - x->ranswered > c->read_ahead_max) {
		c->read_ahead_max = x->rsent - x->ranswered;
	}
	return kvb_am_took(c, x, r);
}

// kvb_xfer_start_am_read asks for a read as KVB_AM_READ requests of at
// most KVB_AM_CHUNK bytes each, KVB_READ_WINDOW of them ahead of their
// answers (kvb_rdata_cb sends the next as each lands); it is complete
// when every chunk's answer landed.
static int kvb_xfer_start_am_read(kvb_ctx *c, kvb_xfer *x, kvb_ep *e, int n, const uint64_t *laddr,
				  const uint64_t *len, const uint64_t *raddr)
{
	size_t chunks;
	uint64_t total;
	if (!kvb_am_begin(x, n, len, &chunks, &total)) {
		return x->stage;
	}
	free(x->rhdrs);
	free(x->rdst);
	free(x->rgot);
	x->rhdrs = chunks ? malloc(chunks * sizeof(kvb_rhdr)) : NULL;
	x->rdst = chunks ? malloc(chunks * sizeof(uint64_t)) : NULL;
	x->rgot = chunks ? calloc(chunks, 1) : NULL;
	x->rchunks = 0;
	if (chunks && (x->rhdrs == NULL || x->rdst == NULL || x->rgot == NULL)) {
		kvb_fail(x, UCS_ERR_NO_MEMORY);
		return x->stage;
	}
	x->am_write = 1; // a message transfer: completes as a write does
	x->am_read = 1;
	x->token = ++c->next_token;
	x->am_total = total;
	x->am_acked = 0;
	x->am_wstatus = UCS_OK;
	x->rchunks = chunks;
	x->amnext = c->amx;
	c->amx = x;
	size_t k = 0;
	for (int i = 0; i < n; i++) {
		for (uint64_t off = 0; off < len[i]; off += KVB_AM_CHUNK, k++) {
			uint64_t m = len[i] - off < KVB_AM_CHUNK ? len[i] - off : KVB_AM_CHUNK;
			x->rhdrs[k] = (kvb_rhdr){x->token, k, raddr[i] + off, m};
			x->rdst[k] = laddr[i] + off;
		}
	}
	x->rsent = x->ranswered = 0;
	while (x->rsent < chunks && x->rsent < KVB_READ_WINDOW) {
		if (!kvb_read_ask(c, x)) {
			return x->stage;
		}
	}
	return x->stage;
}

int kvb_xfer_start(kvb_ctx *c, kvb_xfer *x, kvb_ep *e, int read, int n, const uint64_t *laddr,
		   const uint64_t *len, const uint64_t *raddr, ucp_rkey_h *rkeys, ucp_mem_h *memhs)
{
	x->stage = KVB_XFER_FLUSHING;
	x->status = UCS_OK;
	x->flush_done = 0;
	x->am_done = 0;
	x->am_write = 0;
	x->am_read = 0;
	x->ep = e;
	kvb_amx_unlink(c, x); // a transfer posted again
	if (e->failed) {
		kvb_fail(x, e->status);
		return x->stage;
	}
	if (!read && e->emulated) {
		return kvb_xfer_start_am(c, x, e, n, laddr, len, raddr, memhs);
	}
	if (read && e->emulated) {
		return kvb_xfer_start_am_read(c, x, e, n, laddr, len, raddr);
	}
	for (int i = 0; i < n; i++) {
		ucp_request_param_t p = {0};
		if (memhs[i] != NULL) {
			p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
			p.memh = memhs[i];
		}
		ucs_status_ptr_t r = read ? kvbu.ucp_get_nbx(e->ep, (void *)(uintptr_t)laddr[i], len[i], raddr[i], rkeys[i], &p)
					  : kvbu.ucp_put_nbx(e->ep, (void *)(uintptr_t)laddr[i], len[i], raddr[i], rkeys[i], &p);
		if (UCS_PTR_IS_ERR(r)) {
			kvb_fail(x, UCS_PTR_STATUS(r));
			return x->stage;
		}
		if (r != NULL) {
			// Completion is covered by the flush below.
			kvbu.ucp_request_free(r);
		}
	}
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.send = kvb_flush_cb;
	p.user_data = x;
	ucs_status_ptr_t r = kvbu.ucp_ep_flush_nbx(e->ep, &p);
	if (UCS_PTR_IS_ERR(r)) {
		kvb_fail(x, UCS_PTR_STATUS(r));
	} else if (r == NULL) {
		x->flush_done = 1;
		x->flush_status = UCS_OK;
	} else {
		x->flush_req = r;
		x->outstanding++;
	}
	return x->stage;
}

static ucs_status_ptr_t kvb_am(kvb_ep *e, const void *hdr, size_t hdr_len, const void *msg, size_t msg_len,
			       kvb_xfer *x)
{
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_EAGER;
	if (x != NULL) {
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
		p.cb.send = kvb_am_sent_cb;
		p.user_data = x;
	}
	return kvbu.ucp_am_send_nbx(e->ep, KVB_AM_NOTIF, hdr, hdr_len, msg, msg_len, &p);
}

int kvb_xfer_advance(kvb_ctx *c, kvb_xfer *x, const void *hdr, size_t hdr_len, const void *msg, size_t msg_len,
		     int has_notif)
{
	if (x->stage == KVB_XFER_FLUSHING && x->ep->failed) {
		kvb_fail(x, x->ep->status);
		kvb_amx_unlink(c, x);
	}
	// A message write ends once every send's callback ran too (its headers
	// free, so the transfer can be posted again at once).
	if (x->stage == KVB_XFER_FLUSHING && x->am_write && x->outstanding == 0) {
		if (x->am_wstatus != UCS_OK) {
			kvb_fail(x, x->am_wstatus);
			kvb_amx_unlink(c, x);
		} else if (x->am_acked == x->am_total) {
			kvb_amx_unlink(c, x);
			x->stage = has_notif ? KVB_XFER_NOTIFY : KVB_XFER_DONE;
		}
	}
	if (x->stage == KVB_XFER_FLUSHING && !x->am_write && x->flush_done) {
		if (x->flush_status != UCS_OK) {
			kvb_fail(x, x->flush_status);
		} else {
			x->stage = has_notif ? KVB_XFER_NOTIFY : KVB_XFER_DONE;
		}
	}
	if (x->stage == KVB_XFER_NOTIFY) {
		ucs_status_ptr_t r = kvb_am(x->ep, hdr, hdr_len, msg, msg_len, x);
		if (UCS_PTR_IS_ERR(r)) {
			kvb_fail(x, UCS_PTR_STATUS(r));
		} else if (r == NULL) {
			x->stage = KVB_XFER_DONE;
		} else {
			x->am_req = r;
			x->outstanding++;
			x->stage = KVB_XFER_NOTIFYING;
		}
	}
	if (x->stage == KVB_XFER_NOTIFYING && x->am_done) {
		if (x->am_status != UCS_OK) {
			kvb_fail(x, x->am_status);
		} else {
			x->stage = KVB_XFER_DONE;
		}
	}
	return x->stage;
}

void kvb_xfer_cancel(kvb_ctx *c, kvb_xfer *x)
{
	if (x->flush_req != NULL) {
		kvbu.ucp_request_cancel(c->worker, x->flush_req);
	}
	if (x->am_req != NULL) {
		kvbu.ucp_request_cancel(c->worker, x->am_req);
	}
	if (x->stage > KVB_XFER_IDLE && x->stage < KVB_XFER_DONE) {
		kvb_fail(x, UCS_ERR_CANCELED);
	}
	kvb_amx_unlink(c, x); // its late acks count as unknown
}

void kvb_xfer_free(kvb_ctx *c, kvb_xfer *x)
{
	kvb_amx_unlink(c, x);
	free(x->whdrs);
	free(x->rhdrs);
	free(x->rdst);
	free(x->rgot);
	free(x);
}

int kvb_send_notif(kvb_ctx *c, kvb_ep *e, const void *hdr, size_t hdr_len, const void *msg, size_t msg_len)
{
	if (e->failed) {
		return e->status;
	}
	return kvb_am_raw(c, e, KVB_AM_NOTIF, hdr, hdr_len, msg, msg_len, UCP_AM_SEND_FLAG_EAGER);
}

kvb_notif *kvb_notif_pop(kvb_ctx *c)
{
	kvb_notif *n = c->head;
	if (n != NULL) {
		c->head = n->next;
		if (c->head == NULL) {
			c->tail = NULL;
		}
	}
	return n;
}

void kvb_notif_free(kvb_notif *n)
{
	free(n->name);
	free(n->data);
	free(n);
}

// kvb_am_raw sends one active message as given and waits for it to leave
// (bounded): GenNotif's notification, and the tests' hostile or broken
// peer. The header and data are copied: a send given up on may still be
// queued when the caller frees its buffers.
int kvb_am_raw(kvb_ctx *c, kvb_ep *e, unsigned id, const void *hdr, size_t hdr_len, const void *data, size_t len,
	       unsigned flags)
{
	char *block = malloc(hdr_len + len + 1); // outlives the caller's buffers
	if (block == NULL) {
		return UCS_ERR_NO_MEMORY;
	}
	if (hdr_len > 0) {
		memcpy(block, hdr, hdr_len);
	}
	if (len > 0) {
		memcpy(block + hdr_len, data, len);
	}
	ucp_request_param_t p = {0};
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.flags = flags;
	p.cb.send = kvb_block_sent_cb;
	p.user_data = block;
	ucs_status_ptr_t r = kvbu.ucp_am_send_nbx(e->ep, id, block, hdr_len, block + hdr_len, len, &p);
	if (!UCS_PTR_IS_PTR(r)) {
		free(block);
	}
	if (UCS_PTR_IS_ERR(r)) {
		return UCS_PTR_STATUS(r);
	}
	if (r == NULL) {
		return UCS_OK;
	}
	for (int i = 0; i < 2000000 && kvbu.ucp_request_check_status(r) == UCS_INPROGRESS; i++) {
		kvbu.ucp_worker_progress(c->worker);
	}
	ucs_status_t st = kvbu.ucp_request_check_status(r);
	kvbu.ucp_request_free(r);
	return st == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : st;
}
