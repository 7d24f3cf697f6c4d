// The NIXL C API (libnixl_capi.so), declared here and loaded at run time so
// kvbridge builds and runs where NIXL is not installed. The prototypes follow
// NIXL's src/bindings/rust/wrapper.h; handles are opaque pointers.
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
};

enum { NX_MEM_DRAM = 0, NX_MEM_VRAM = 1 };
enum { NX_OP_READ = 0, NX_OP_WRITE = 1 };

typedef struct kvb_nixl {
	void *core, *capi;
	nx_status (*create_agent)(const char *, nx_h *);
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
	nx_status (*create_reg_dlist)(int, nx_h *, bool);
	nx_status (*destroy_reg_dlist)(nx_h);
	nx_status (*reg_dlist_add_desc)(nx_h, uintptr_t, size_t, uint64_t, const void *, size_t);
	nx_status (*register_mem)(nx_h, nx_h, nx_h);
	nx_status (*deregister_mem)(nx_h, nx_h, nx_h);
	nx_status (*create_xfer_dlist)(int, nx_h *, bool);
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
// with RTLD_GLOBAL, then the C API library, and resolves every symbol. On
// failure it returns NULL and writes why into err.
kvb_nixl *kvb_nixl_load(const char *path, char *err, size_t errlen);

#endif
