// The CUDA driver API subset kvbridge uses, declared here and loaded at run
// time from libcuda.so.1, so the module builds without the CUDA toolkit.
#ifndef KVB_CUDA_H
#define KVB_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int cu_result;
typedef int cu_device;
typedef void *cu_context;
typedef void *cu_stream;
typedef void *cu_event;
typedef unsigned long long cu_ptr;
typedef void *cu_module;
typedef void *cu_function;
typedef struct { char reserved[64]; } cu_ipc_handle;

enum { KVB_CU_MEMTYPE_ATTR = 2, KVB_CU_ORDINAL_ATTR = 9 };
enum { KVB_CU_EVENT_DISABLE_TIMING = 2, KVB_CU_ERROR_NOT_READY = 600 };

typedef struct kvb_cuda {
	void *h;
	cu_result (*init)(unsigned int);
	cu_result (*driver_version)(int *);
	cu_result (*device_count)(int *);
	cu_result (*device_get)(cu_device *, int);
	cu_result (*primary_retain)(cu_context *, cu_device);
	cu_result (*primary_release)(cu_device);
	cu_result (*ctx_set_current)(cu_context);
	cu_result (*mem_alloc)(cu_ptr *, size_t);
	cu_result (*mem_free)(cu_ptr);
	cu_result (*memcpy_htod)(cu_ptr, const void *, size_t);
	cu_result (*memcpy_dtoh)(void *, cu_ptr, size_t);
	cu_result (*memcpy_dtod)(cu_ptr, cu_ptr, size_t);
	cu_result (*memcpy_any)(cu_ptr, cu_ptr, size_t);
	cu_result (*memcpy_htod_async)(cu_ptr, const void *, size_t, cu_stream);
	cu_result (*memcpy_dtoh_async)(void *, cu_ptr, size_t, cu_stream);
	cu_result (*memcpy_dtod_async)(cu_ptr, cu_ptr, size_t, cu_stream);
	cu_result (*memcpy_any_async)(cu_ptr, cu_ptr, size_t, cu_stream);
	cu_result (*stream_create)(cu_stream *, unsigned int);
	cu_result (*stream_sync)(cu_stream);
	cu_result (*stream_destroy)(cu_stream);
	cu_result (*event_create)(cu_event *, unsigned int);
	cu_result (*event_record)(cu_event, cu_stream);
	cu_result (*event_query)(cu_event);
	cu_result (*event_sync)(cu_event);
	cu_result (*event_destroy)(cu_event);
	cu_result (*ipc_get)(cu_ipc_handle *, cu_ptr);
	cu_result (*ipc_open)(cu_ptr *, cu_ipc_handle, unsigned int);
	cu_result (*ipc_close)(cu_ptr);
	cu_result (*pointer_attr)(void *, int, cu_ptr);
	cu_result (*address_range)(cu_ptr *, size_t *, cu_ptr);
	cu_result (*error_name)(cu_result, const char **);
	cu_result (*module_load_data)(cu_module *, const void *);
	cu_result (*module_get_function)(cu_function *, cu_module, const char *);
	cu_result (*module_unload)(cu_module);
	cu_result (*launch_kernel)(cu_function, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, cu_stream, void **, void **);
} kvb_cuda;

kvb_cuda *kvb_cuda_load(const char *path, char *err, size_t errlen);

// Calls more than one Go file makes (each file's cgo preamble is its own).
static inline int cu_primary(kvb_cuda *c, int ordinal, cu_context *ctx)
{
	cu_device d;
	int r = c->device_get(&d, ordinal);
	return r ? r : c->primary_retain(ctx, d);
}
static inline int cu_alloc(kvb_cuda *c, cu_ptr *p, size_t n) { return c->mem_alloc(p, n); }
static inline int cu_free(kvb_cuda *c, cu_ptr p) { return c->mem_free(p); }
static inline int cu_htod(kvb_cuda *c, cu_ptr d, uintptr_t s, size_t n) { return c->memcpy_htod(d, (const void *)s, n); }
static inline int cu_dtoh(kvb_cuda *c, uintptr_t d, cu_ptr s, size_t n) { return c->memcpy_dtoh((void *)d, s, n); }

#endif
