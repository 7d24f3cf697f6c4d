#include "cuda.h"

#include "kvb_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static const kvb_dl_sym cuda_syms[] = {
	KVB_DL_SYM(kvb_cuda, init, "cuInit", 1),
	KVB_DL_SYM(kvb_cuda, driver_version, "cuDriverGetVersion", 1),
	KVB_DL_SYM(kvb_cuda, device_count, "cuDeviceGetCount", 1),
	KVB_DL_SYM(kvb_cuda, device_get, "cuDeviceGet", 1),
	KVB_DL_SYM(kvb_cuda, primary_retain, "cuDevicePrimaryCtxRetain", 1),
	KVB_DL_SYM(kvb_cuda, primary_release, "cuDevicePrimaryCtxRelease_v2", 1),
	KVB_DL_SYM(kvb_cuda, ctx_set_current, "cuCtxSetCurrent", 1),
	KVB_DL_SYM(kvb_cuda, mem_alloc, "cuMemAlloc_v2", 1),
	KVB_DL_SYM(kvb_cuda, mem_free, "cuMemFree_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_htod, "cuMemcpyHtoD_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_dtoh, "cuMemcpyDtoH_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_dtod, "cuMemcpyDtoD_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_any, "cuMemcpy", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_htod_async, "cuMemcpyHtoDAsync_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_dtod_async, "cuMemcpyDtoDAsync_v2", 1),
	KVB_DL_SYM(kvb_cuda, memcpy_any_async, "cuMemcpyAsync", 1),
	KVB_DL_SYM(kvb_cuda, stream_create, "cuStreamCreate", 1),
	KVB_DL_SYM(kvb_cuda, stream_sync, "cuStreamSynchronize", 1),
	KVB_DL_SYM(kvb_cuda, stream_destroy, "cuStreamDestroy_v2", 1),
	KVB_DL_SYM(kvb_cuda, event_create, "cuEventCreate", 1),
	KVB_DL_SYM(kvb_cuda, event_record, "cuEventRecord", 1),
	KVB_DL_SYM(kvb_cuda, event_query, "cuEventQuery", 1),
	KVB_DL_SYM(kvb_cuda, event_sync, "cuEventSynchronize", 1),
	KVB_DL_SYM(kvb_cuda, event_destroy, "cuEventDestroy_v2", 1),
	KVB_DL_SYM(kvb_cuda, ipc_get, "cuIpcGetMemHandle", 1),
	KVB_DL_SYM(kvb_cuda, ipc_open, "cuIpcOpenMemHandle_v2", 1),
	KVB_DL_SYM(kvb_cuda, ipc_close, "cuIpcCloseMemHandle", 1),
	KVB_DL_SYM(kvb_cuda, pointer_attr, "cuPointerGetAttribute", 1),
	KVB_DL_SYM(kvb_cuda, address_range, "cuMemGetAddressRange_v2", 1),
	KVB_DL_SYM(kvb_cuda, error_name, "cuGetErrorName", 1),
	KVB_DL_SYM(kvb_cuda, module_load_data, "cuModuleLoadData", 1),
	KVB_DL_SYM(kvb_cuda, module_get_function, "cuModuleGetFunction", 1),
	KVB_DL_SYM(kvb_cuda, module_unload, "cuModuleUnload", 1),
	KVB_DL_SYM(kvb_cuda, launch_kernel, "cuLaunchKernel", 1),
};

kvb_cuda *kvb_cuda_load(const char *path, char *err, size_t errlen)
{
	kvb_cuda *c = calloc(1, sizeof(*c));
	c->h = kvb_dl_open(path, RTLD_NOW | RTLD_LOCAL, err, errlen);
	if (c->h == NULL) {
		free(c);
		return NULL;
	}
	const char *missing = kvb_dl_bind(c->h, c, cuda_syms, KVB_DL_LEN(cuda_syms));
	if (missing != NULL) {
		snprintf(err, errlen, "%s: missing symbol %s", path, missing);
		dlclose(c->h);
		free(c);
		return NULL;
	}
	return c;
}
