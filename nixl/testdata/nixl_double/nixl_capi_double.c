// A TEST DOUBLE of NIXL's C API (libnixl_capi.so), for kvbridge's libnixl
// engine tests on machines without NIXL. Semantics: agents in one process
// find each other by name; a transfer is a memcpy; notifications queue on
// the target agent. Prepared descriptors are checked against registered
// memory (local, or the remote agent's). Failure injection: set
// KVB_NIXL_DOUBLE_FAIL to a function name (e.g. "nixl_capi_post_xfer_req")
// and that function returns NIXL_CAPI_ERROR_BACKEND. With
// KVB_NIXL_DOUBLE_ASYNC=1 a post returns IN_PROG and the copy happens on the
// next status call, as a progress thread would; with "stuck" it never does.
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern int nixl_double_core_version(void);

typedef int st_t;
enum { OK = 0, INVALID = -1, BACKEND = -2, STATE = -3, IN_PROG = 1 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int fail(const char *fn)
{
	const char *f = getenv("KVB_NIXL_DOUBLE_FAIL");
	return f != NULL && strcmp(f, fn) == 0;
}
#define INJECT() \
	if (fail(__func__)) return BACKEND

typedef struct desc { uintptr_t addr; size_t len; uint64_t dev; } desc;
typedef struct dlist { int mem; desc *d; size_t n; } dlist;
typedef struct notif { struct notif *next; char *from; void *data; size_t len; } notif;
typedef struct reg { struct reg *next; int mem; desc d; } reg;
typedef struct agent {
	struct agent *next;
	char *name;
	reg *regs;
	notif *head, *tail;
	char **remotes;
	size_t nremotes;
} agent;
typedef struct handle { agent *owner; char *remote; dlist l; } handle;
typedef struct opt { void *backend; void *msg; size_t len; bool has; } opt;
typedef struct req {
	agent *a;
	int op;
	handle *lh, *rh;
	int *li, *ri;
	size_t n;
	void *msg;
	size_t len;
	bool has;
	int state; // 0 idle, 1 posted (async pending), 2 done
	bool released;
} req;
typedef struct nmap { size_t n; char **agents; notif **lists; } nmap;

static agent *agents;

static agent *find(const char *name)
{
	for (agent *a = agents; a; a = a->next)
		if (strcmp(a->name, name) == 0) return a;
	return NULL;
}

st_t nixl_capi_create_agent(const char *name, void **out)
{
	INJECT();
	if (!name || !out || nixl_double_core_version() != 1) return INVALID;
	pthread_mutex_lock(&mu);
	if (find(name)) { pthread_mutex_unlock(&mu); return INVALID; }
	agent *a = calloc(1, sizeof(*a));
	a->name = strdup(name);
	a->next = agents;
	agents = a;
	pthread_mutex_unlock(&mu);
	*out = a;
	return OK;
}

st_t nixl_capi_destroy_agent(void *p)
{
	agent *a = p;
	pthread_mutex_lock(&mu);
	for (agent **pp = &agents; *pp; pp = &(*pp)->next)
		if (*pp == a) { *pp = a->next; break; }
	pthread_mutex_unlock(&mu);
	while (a->regs) { reg *r = a->regs; a->regs = r->next; free(r); }
	while (a->head) { notif *n = a->head; a->head = n->next; free(n->from); free(n->data); free(n); }
	for (size_t i = 0; i < a->nremotes; i++) free(a->remotes[i]);
	free(a->remotes);
	free(a->name);
	free(a);
	return OK;
}

// Metadata: "DBL1" then the agent's name.
st_t nixl_capi_get_local_md(void *p, void **data, size_t *len)
{
	INJECT();
	agent *a = p;
	size_t n = strlen(a->name);
	*data = malloc(4 + n);
	memcpy(*data, "DBL1", 4);
	memcpy((char *)*data + 4, a->name, n);
	*len = 4 + n;
	return OK;
}

st_t nixl_capi_load_remote_md(void *p, const void *data, size_t len, char **name)
{
	INJECT();
	agent *a = p;
	if (len < 5 || memcmp(data, "DBL1", 4) != 0) return INVALID;
	char *n = strndup((const char *)data + 4, len - 4);
	pthread_mutex_lock(&mu);
	agent *r = find(n);
	if (r == NULL) { pthread_mutex_unlock(&mu); free(n); return BACKEND; }
	a->remotes = realloc(a->remotes, (a->nremotes + 1) * sizeof(char *));
	a->remotes[a->nremotes++] = strdup(n);
	pthread_mutex_unlock(&mu);
	*name = n; // malloc'ed: the caller frees it
	return OK;
}

static bool knows(agent *a, const char *name)
{
	for (size_t i = 0; i < a->nremotes; i++)
		if (a->remotes[i] && strcmp(a->remotes[i], name) == 0) return true;
	return false;
}

st_t nixl_capi_invalidate_remote_md(void *p, const char *name)
{
	INJECT();
	agent *a = p;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < a->nremotes; i++)
		if (a->remotes[i] && strcmp(a->remotes[i], name) == 0) { free(a->remotes[i]); a->remotes[i] = NULL; }
	pthread_mutex_unlock(&mu);
	return OK;
}

typedef struct params { int dummy; } params;
st_t nixl_capi_get_plugin_params(void *a, const char *plugin, void **mems, void **p)
{
	INJECT();
	(void)a;
	if (strcmp(plugin, "UCX") != 0) return INVALID;
	*mems = calloc(1, 1);
	*p = calloc(1, sizeof(params));
	return OK;
}
st_t nixl_capi_destroy_mem_list(void *m) { free(m); return OK; }
st_t nixl_capi_destroy_params(void *p) { free(p); return OK; }
st_t nixl_capi_params_add(void *p, const char *k, const char *v)
{
	INJECT();
	return (p && k && v && strcmp(k, "bogus_param") != 0) ? OK : INVALID;
}
st_t nixl_capi_create_backend(void *a, const char *plugin, void *p, void **b)
{
	INJECT();
	(void)p;
	if (strcmp(plugin, "UCX") != 0) return INVALID;
	*b = a;
	return OK;
}
st_t nixl_capi_destroy_backend(void *b) { (void)b; return OK; }

st_t nixl_capi_create_opt_args(void **o) { *o = calloc(1, sizeof(opt)); return OK; }
st_t nixl_capi_destroy_opt_args(void *o) { opt *x = o; if (x) free(x->msg); free(o); return OK; }
st_t nixl_capi_opt_args_add_backend(void *o, void *b) { ((opt *)o)->backend = b; return OK; }
st_t nixl_capi_opt_args_set_notif_msg(void *o, const void *d, size_t n)
{
	opt *x = o;
	free(x->msg);
	x->msg = malloc(n ? n : 1);
	memcpy(x->msg, d, n);
	x->len = n;
	return OK;
}
st_t nixl_capi_opt_args_set_has_notif(void *o, bool v) { ((opt *)o)->has = v; return OK; }

static st_t dl_create(int mem, void **out) { dlist *l = calloc(1, sizeof(*l)); l->mem = mem; *out = l; return OK; }
static st_t dl_destroy(void *p) { dlist *l = p; free(l->d); free(l); return OK; }
static st_t dl_add(void *p, uintptr_t addr, size_t len, uint64_t dev)
{
	dlist *l = p;
	l->d = realloc(l->d, (l->n + 1) * sizeof(desc));
	l->d[l->n++] = (desc){addr, len, dev};
	return OK;
}
st_t nixl_capi_create_reg_dlist(int mem, void **out, bool sorted) { (void)sorted; return dl_create(mem, out); }
st_t nixl_capi_destroy_reg_dlist(void *p) { return dl_destroy(p); }
st_t nixl_capi_reg_dlist_add_desc(void *p, uintptr_t addr, size_t len, uint64_t dev, const void *md, size_t mdlen)
{
	(void)md; (void)mdlen;
	return dl_add(p, addr, len, dev);
}
st_t nixl_capi_create_xfer_dlist(int mem, void **out, bool sorted) { (void)sorted; return dl_create(mem, out); }
st_t nixl_capi_destroy_xfer_dlist(void *p) { return dl_destroy(p); }
st_t nixl_capi_xfer_dlist_add_desc(void *p, uintptr_t addr, size_t len, uint64_t dev) { return dl_add(p, addr, len, dev); }

st_t nixl_capi_register_mem(void *p, void *dl, void *o)
{
	INJECT();
	(void)o;
	agent *a = p;
	dlist *l = dl;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < l->n; i++) {
		reg *r = calloc(1, sizeof(*r));
		r->mem = l->mem;
		r->d = l->d[i];
		r->next = a->regs;
		a->regs = r;
	}
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_deregister_mem(void *p, void *dl, void *o)
{
	INJECT();
	(void)o;
	agent *a = p;
	dlist *l = dl;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < l->n; i++)
		for (reg **rr = &a->regs; *rr; rr = &(*rr)->next)
			if ((*rr)->d.addr == l->d[i].addr && (*rr)->d.len == l->d[i].len) {
				reg *r = *rr;
				*rr = r->next;
				free(r);
				break;
			}
	pthread_mutex_unlock(&mu);
	return OK;
}

static bool covered(agent *a, int mem, desc d)
{
	for (reg *r = a->regs; r; r = r->next)
		if (r->mem == mem && r->d.dev == d.dev && d.addr >= r->d.addr && d.addr + d.len <= r->d.addr + r->d.len)
			return true;
	return false;
}

st_t nixl_capi_prep_xfer_dlist(void *p, const char *remote, void *dl, void **out, void *o)
{
	INJECT();
	(void)o;
	agent *a = p;
	dlist *l = dl;
	pthread_mutex_lock(&mu);
	agent *target = a;
	if (remote && remote[0]) {
		target = find(remote);
		if (target == NULL || !knows(a, remote)) { pthread_mutex_unlock(&mu); return INVALID; }
	}
	for (size_t i = 0; i < l->n; i++)
		if (!covered(target, l->mem, l->d[i])) { pthread_mutex_unlock(&mu); return INVALID; }
	pthread_mutex_unlock(&mu);
	handle *h = calloc(1, sizeof(*h));
	h->owner = a;
	h->remote = strdup(remote ? remote : "");
	h->l.mem = l->mem;
	h->l.n = l->n;
	h->l.d = malloc(l->n * sizeof(desc) + 1);
	memcpy(h->l.d, l->d, l->n * sizeof(desc));
	*out = h;
	return OK;
}

st_t nixl_capi_release_xfer_dlist_handle(void *a, void *p)
{
	(void)a;
	handle *h = p;
	free(h->remote);
	free(h->l.d);
	free(h);
	return OK;
}

st_t nixl_capi_make_xfer_req(void *p, int op, void *lh, const int *li, size_t ln, void *rh, const int *ri, size_t rn,
			     void **out, void *o)
{
	INJECT();
	handle *l = lh, *r = rh;
	opt *x = o;
	if (ln != rn || ln == 0 || l->remote[0] != 0 || r->remote[0] == 0) return INVALID;
	for (size_t i = 0; i < ln; i++) {
		if (li[i] < 0 || (size_t)li[i] >= l->l.n || ri[i] < 0 || (size_t)ri[i] >= r->l.n) return INVALID;
		if (l->l.d[li[i]].len != r->l.d[ri[i]].len) return INVALID;
	}
	req *q = calloc(1, sizeof(*q));
	q->a = p;
	q->op = op;
	q->lh = l;
	q->rh = r;
	q->n = ln;
	q->li = malloc(ln * sizeof(int));
	q->ri = malloc(ln * sizeof(int));
	memcpy(q->li, li, ln * sizeof(int));
	memcpy(q->ri, ri, ln * sizeof(int));
	if (x && x->has) {
		q->has = true;
		q->len = x->len;
		q->msg = malloc(x->len ? x->len : 1);
		memcpy(q->msg, x->msg, x->len);
	}
	*out = q;
	return OK;
}

static void push_notif(agent *to, const char *from, const void *d, size_t n)
{
	notif *x = calloc(1, sizeof(*x));
	x->from = strdup(from);
	x->data = malloc(n ? n : 1);
	memcpy(x->data, d, n);
	x->len = n;
	if (to->tail) to->tail->next = x; else to->head = x;
	to->tail = x;
}

// complete copies the data and sends the notification, or fails if the
// remote is gone or its memory was deregistered since prep.
static st_t complete(req *q)
{
	pthread_mutex_lock(&mu);
	agent *remote = find(q->rh->remote);
	if (remote == NULL || !knows(q->a, q->rh->remote)) { pthread_mutex_unlock(&mu); return BACKEND; }
	for (size_t i = 0; i < q->n; i++) {
		desc l = q->lh->l.d[q->li[i]], r = q->rh->l.d[q->ri[i]];
		if (!covered(remote, q->rh->l.mem, r) || !covered(q->a, q->lh->l.mem, l)) { pthread_mutex_unlock(&mu); return BACKEND; }
		if (q->op == 1) memmove((void *)r.addr, (void *)l.addr, l.len);
		else memmove((void *)l.addr, (void *)r.addr, l.len);
	}
	if (q->has) push_notif(remote, q->a->name, q->msg, q->len);
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_post_xfer_req(void *a, void *p, void *o)
{
	INJECT();
	(void)a; (void)o;
	req *q = p;
	if (q->released || q->state == 1) return STATE;
	const char *async = getenv("KVB_NIXL_DOUBLE_ASYNC");
	if (async && (strcmp(async, "1") == 0 || strcmp(async, "stuck") == 0)) { q->state = 1; return IN_PROG; }
	st_t st = complete(q);
	q->state = st == OK ? 2 : -1;
	return st;
}

st_t nixl_capi_get_xfer_status(void *a, void *p)
{
	INJECT();
	(void)a;
	req *q = p;
	const char *async = getenv("KVB_NIXL_DOUBLE_ASYNC");
	if (q->state == 1 && async && strcmp(async, "stuck") == 0) return IN_PROG; // never progresses
	if (q->state == 1) {
		st_t st = complete(q);
		q->state = st == OK ? 2 : -1;
		return st == OK ? IN_PROG : st; // done on the following call
	}
	return q->state == 2 ? OK : q->state == -1 ? BACKEND : STATE;
}

st_t nixl_capi_release_xfer_req(void *a, void *p) { (void)a; ((req *)p)->released = true; return OK; }

st_t nixl_capi_destroy_xfer_req(void *p)
{
	req *q = p;
	if (!q->released) return STATE; // NIXL wants release first
	free(q->li); free(q->ri); free(q->msg); free(q);
	return OK;
}

st_t nixl_capi_gen_notif(void *p, const char *remote, const void *d, size_t n, void *o)
{
	INJECT();
	(void)o;
	agent *a = p;
	pthread_mutex_lock(&mu);
	agent *r = find(remote);
	if (r == NULL || !knows(a, remote)) { pthread_mutex_unlock(&mu); return INVALID; }
	push_notif(r, a->name, d, n);
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_create_notif_map(void **m) { *m = calloc(1, sizeof(nmap)); return OK; }
st_t nixl_capi_notif_map_clear(void *p)
{
	nmap *m = p;
	for (size_t i = 0; i < m->n; i++) {
		free(m->agents[i]);
		while (m->lists[i]) { notif *x = m->lists[i]; m->lists[i] = x->next; free(x->from); free(x->data); free(x); }
	}
	free(m->agents); free(m->lists);
	m->agents = NULL; m->lists = NULL; m->n = 0;
	return OK;
}
st_t nixl_capi_destroy_notif_map(void *p) { nixl_capi_notif_map_clear(p); free(p); return OK; }

st_t nixl_capi_get_notifs(void *p, void *mp, void *o)
{
	INJECT();
	(void)o;
	agent *a = p;
	nmap *m = mp;
	pthread_mutex_lock(&mu);
	while (a->head) {
		notif *x = a->head;
		a->head = x->next;
		x->next = NULL;
		size_t i = 0;
		while (i < m->n && strcmp(m->agents[i], x->from) != 0) i++;
		if (i == m->n) {
			m->agents = realloc(m->agents, (m->n + 1) * sizeof(char *));
			m->lists = realloc(m->lists, (m->n + 1) * sizeof(notif *));
			m->agents[m->n] = strdup(x->from);
			m->lists[m->n] = NULL;
			m->n++;
		}
		notif **tail = &m->lists[i];
		while (*tail) tail = &(*tail)->next;
		*tail = x;
	}
	a->tail = NULL;
	pthread_mutex_unlock(&mu);
	return OK;
}

st_t nixl_capi_notif_map_size(void *p, size_t *n) { *n = ((nmap *)p)->n; return OK; }
st_t nixl_capi_notif_map_get_agent_at(void *p, size_t i, const char **s)
{
	nmap *m = p;
	if (i >= m->n) return INVALID;
	*s = m->agents[i];
	return OK;
}
static notif *list_of(nmap *m, const char *s)
{
	for (size_t i = 0; i < m->n; i++)
		if (strcmp(m->agents[i], s) == 0) return m->lists[i];
	return NULL;
}
st_t nixl_capi_notif_map_get_notifs_size(void *p, const char *s, size_t *n)
{
	size_t k = 0;
	for (notif *x = list_of(p, s); x; x = x->next) k++;
	*n = k;
	return OK;
}
st_t nixl_capi_notif_map_get_notif(void *p, const char *s, size_t i, const void **d, size_t *n)
{
	notif *x = list_of(p, s);
	while (x && i--) x = x->next;
	if (!x) return INVALID;
	*d = x->data;
	*n = x->len;
	return OK;
}
