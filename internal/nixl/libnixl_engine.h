// The NIXL C API (libnixl_capi.so), declared here and loaded at run time so
// kvbridge builds and runs where NIXL is not installed. The prototypes are
// those of NIXL 1.4.0's src/bindings/rust/wrapper.h (the C API has been
// stable in these calls since 0.9, the first with nixl_capi_is_stub);
// handles are opaque pointers.
#ifndef KVB_LIBNIXL_ENGINE_H
#define KVB_LIBNIXL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int nx_status;          // nixl_capi_status_t
typedef void *nx_h;             // any opaque nixl_capi_*_t handle

enum {
	NX_SUCCESS = 0,
	NX_ERROR_INVALID_PARAM = -1,
	NX_ERROR_BACKEND = -2,
	NX_ERROR_INVALID_STATE = -3,
	NX_ERROR_EXCEPTION = -4,
	NX_IN_PROG = 1,
	NX_ERROR_NO_TELEMETRY = -5,
	NX_ERROR_NOT_FOUND = -6, // newer headers
};

// nixl_capi_thread_sync_t
enum { NX_SYNC_NONE = 0, NX_SYNC_STRICT = 1, NX_SYNC_RW = 2 };

// nixl_capi_agent_config_t, as in NIXL 0.7 – 1.4.
typedef struct nx_agent_config {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} nx_agent_config;

enum { NX_MEM_DRAM = 0, NX_MEM_VRAM = 1 };
enum { NX_OP_READ = 0, NX_OP_WRITE = 1 };

typedef struct kvb_nixl {
	void *core, *capi;
	nx_status (*create_configured_agent)(const char *, const nx_agent_config *, nx_h *);
	bool (*is_stub)(void);
	void (*mem_free)(void *); // optional: newer headers free NIXL's buffers with it
	nx_status (*destroy_agent)(nx_h);
	nx_status (*get_local_md)(nx_h, void **, size_t *);
	nx_status (*load_remote_md)(nx_h, const void *, size_t, char **);
	nx_status (*invalidate_remote_md)(nx_h, const char *);
	nx_status (*get_plugin_params)(nx_h, const char *, nx_h *, nx_h *);
	nx_status (*destroy_mem_list)(nx_h);
	nx_status (*destroy_params)(nx_h);
	nx_status (*params_add)(nx_h, const char *, const char *); // optional (NIXL ≥ 0.9)
	nx_status (*create_backend)(nx_h, const char *, nx_h, nx_h *);
	nx_status (*destroy_backend)(nx_h);
	nx_status (*create_opt_args)(nx_h *);
	nx_status (*destroy_opt_args)(nx_h);
	nx_status (*opt_args_add_backend)(nx_h, nx_h);
	nx_status (*opt_args_set_notif_msg)(nx_h, const void *, size_t);
	nx_status (*opt_args_set_has_notif)(nx_h, bool);
	nx_status (*create_reg_dlist)(int, nx_h *);
	nx_status (*destroy_reg_dlist)(nx_h);
	nx_status (*reg_dlist_add_desc)(nx_h, uintptr_t, size_t, uint64_t, const void *, size_t);
	nx_status (*register_mem)(nx_h, nx_h, nx_h);
	nx_status (*deregister_mem)(nx_h, nx_h, nx_h);
	nx_status (*create_xfer_dlist)(int, nx_h *);
	nx_status (*destroy_xfer_dlist)(nx_h);
	nx_status (*xfer_dlist_add_desc)(nx_h, uintptr_t, size_t, uint64_t);
	nx_status (*prep_xfer_dlist)(nx_h, const char *, nx_h, nx_h *, nx_h);
	nx_status (*release_xfer_dlist_handle)(nx_h, nx_h);
	nx_status (*make_xfer_req)(nx_h, int, nx_h, const int *, size_t, nx_h, const int *, size_t, nx_h *, nx_h);
	nx_status (*post_xfer_req)(nx_h, nx_h, nx_h);
	nx_status (*get_xfer_status)(nx_h, nx_h);
	nx_status (*release_xfer_req)(nx_h, nx_h);
	nx_status (*destroy_xfer_req)(nx_h);
	nx_status (*gen_notif)(nx_h, const char *, const void *, size_t, nx_h);
	nx_status (*create_notif_map)(nx_h *);
	nx_status (*destroy_notif_map)(nx_h);
	nx_status (*get_notifs)(nx_h, nx_h, nx_h);
	nx_status (*notif_map_size)(nx_h, size_t *);
	nx_status (*notif_map_get_agent_at)(nx_h, size_t, const char **);
	nx_status (*notif_map_get_notifs_size)(nx_h, const char *, size_t *);
	nx_status (*notif_map_get_notif)(nx_h, const char *, size_t, const void **, size_t *);
	nx_status (*notif_map_clear)(nx_h);
} kvb_nixl;

// kvb_nixl_load loads libnixl.so (when it sits beside the C API library)
// with RTLD_GLOBAL, then the C API library, resolves every symbol and checks
// that it is a supported, real NIXL (not the stub NIXL ships for builds
// without it). On failure it closes what it opened, returns NULL and writes
// why into err.
kvb_nixl *kvb_nixl_load(const char *path, char *err, size_t errlen);

// kvb_loaded_ucx_version reads the release of the libucp already mapped in
// this process (the one NIXL's UCX plugin brought; nothing is loaded):
// the number of libucp objects mapped, 0 when none (or it has no
// ucp_get_version), with the first one's release.
int kvb_loaded_ucx_version(unsigned *major, unsigned *minor, unsigned *release);

#endif
