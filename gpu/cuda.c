#include "cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

kvb_cuda *kvb_cuda_load(const char *path, char *err, size_t errlen)
{
	kvb_cuda *c = calloc(1, sizeof(*c));
	c->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (c->h == NULL) {
		snprintf(err, errlen, "%s", dlerror());
		free(c);
		return NULL;
	}
#define SYM(field, name)                                                            \
	do {                                                                        \
		*(void **)(&c->field) = dlsym(c->h, name);                          \
		if (c->field == NULL) {                                             \
			snprintf(err, errlen, "%s: missing symbol %s", path, name); \
			dlclose(c->h);                                              \
			free(c);                                                    \
			return NULL;                                                \
		}                                                                   \
	} while (0)
	SYM(init, "cuInit");
	SYM(driver_version, "cuDriverGetVersion");
	SYM(device_count, "cuDeviceGetCount");
	SYM(device_get, "cuDeviceGet");
	SYM(primary_retain, "cuDevicePrimaryCtxRetain");
	SYM(primary_release, "cuDevicePrimaryCtxRelease_v2");
	SYM(ctx_set_current, "cuCtxSetCurrent");
	SYM(mem_alloc, "cuMemAlloc_v2");
	SYM(mem_free, "cuMemFree_v2");
	SYM(memcpy_htod, "cuMemcpyHtoD_v2");
	SYM(memcpy_dtoh, "cuMemcpyDtoH_v2");
	SYM(memcpy_dtod, "cuMemcpyDtoD_v2");
	SYM(memcpy_any, "cuMemcpy");
	SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
	SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
	SYM(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
	SYM(memcpy_any_async, "cuMemcpyAsync");
	SYM(stream_create, "cuStreamCreate");
	SYM(stream_sync, "cuStreamSynchronize");
	SYM(stream_destroy, "cuStreamDestroy_v2");
	SYM(event_create, "cuEventCreate");
	SYM(event_record, "cuEventRecord");
	SYM(event_query, "cuEventQuery");
	SYM(event_sync, "cuEventSynchronize");
	SYM(event_destroy, "cuEventDestroy_v2");
	SYM(ipc_get, "cuIpcGetMemHandle");
	SYM(ipc_open, "cuIpcOpenMemHandle_v2");
	SYM(ipc_close, "cuIpcCloseMemHandle");
	SYM(pointer_attr, "cuPointerGetAttribute");
	SYM(address_range, "cuMemGetAddressRange_v2");
	SYM(error_name, "cuGetErrorName");
#undef SYM
	return c;
}
