// The one dlopen loader under kvbridge's C engines: the CUDA driver
// (gpu/cuda.c), UCX's libucp (internal/nixl/ucx/ucx_engine.c) and NIXL's C API
// (internal/nixl/libnixl_engine.c) each describe the symbols they need as a table
// of (name, slot, required) and bind it with kvb_dl_bind; each names the
// library and the missing symbol in its own words. Header-only: the cgo
// packages include it with -I${SRCDIR}/../internal/dl (see doc.go).
#ifndef KVB_DL_H
#define KVB_DL_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

// kvb_dl_sym is one symbol a library must (or may) provide, and where its
// address goes: the slot at offset in the caller's table struct.
typedef struct {
	const char *name;
	size_t offset;
	int required;
} kvb_dl_sym;

// KVB_DL_SYM describes the symbol name bound to type's field.
#define KVB_DL_SYM(type, field, name, required) {(name), offsetof(type, field), (required)}

// kvb_dl_open opens path with flags (RTLD_*); NULL with dlerror's message
// in err on failure.
static inline void *kvb_dl_open(const char *path, int flags, char *err, size_t errlen)
{
	void *h = dlopen(path, flags);
	if (h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
	}
	return h;
}

// kvb_dl_bind looks up each of the n symbols in h and stores its address
// in its slot of table (NULL where an optional one is missing). It returns
// the name of the first required symbol h lacks, or NULL when all are
// bound.
static inline const char *kvb_dl_bind(void *h, void *table, const kvb_dl_sym *syms, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		void *p = dlsym(h, syms[i].name);
		*(void **)((char *)table + syms[i].offset) = p;
		if (p == NULL && syms[i].required) {
			return syms[i].name;
		}
	}
	return NULL;
}

#define KVB_DL_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
