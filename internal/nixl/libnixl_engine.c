#define _GNU_SOURCE
#include "libnixl_engine.h"

#include "kvb_dl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// kvb_nixl_refuse closes what kvb_nixl_load opened and frees it.
static kvb_nixl *kvb_nixl_refuse(kvb_nixl *l)
{
	dlclose(l->capi);
	if (l->core) {
		dlclose(l->core);
	}
	free(l);
	return NULL;
}

static const kvb_dl_sym nixl_syms[] = {
	KVB_DL_SYM(kvb_nixl, create_configured_agent, "nixl_capi_create_configured_agent", 1),
	KVB_DL_SYM(kvb_nixl, mem_free, "nixl_capi_mem_free", 0),
	KVB_DL_SYM(kvb_nixl, destroy_agent, "nixl_capi_destroy_agent", 1),
	KVB_DL_SYM(kvb_nixl, get_local_md, "nixl_capi_get_local_md", 1),
	KVB_DL_SYM(kvb_nixl, load_remote_md, "nixl_capi_load_remote_md", 1),
	KVB_DL_SYM(kvb_nixl, invalidate_remote_md, "nixl_capi_invalidate_remote_md", 1),
	KVB_DL_SYM(kvb_nixl, get_plugin_params, "nixl_capi_get_plugin_params", 1),
	KVB_DL_SYM(kvb_nixl, destroy_mem_list, "nixl_capi_destroy_mem_list", 1),
	KVB_DL_SYM(kvb_nixl, destroy_params, "nixl_capi_destroy_params", 1),
	KVB_DL_SYM(kvb_nixl, params_add, "nixl_capi_params_add", 0),
	KVB_DL_SYM(kvb_nixl, create_backend, "nixl_capi_create_backend", 1),
	KVB_DL_SYM(kvb_nixl, destroy_backend, "nixl_capi_destroy_backend", 1),
	KVB_DL_SYM(kvb_nixl, create_opt_args, "nixl_capi_create_opt_args", 1),
	KVB_DL_SYM(kvb_nixl, destroy_opt_args, "nixl_capi_destroy_opt_args", 1),
	KVB_DL_SYM(kvb_nixl, opt_args_add_backend, "nixl_capi_opt_args_add_backend", 1),
	KVB_DL_SYM(kvb_nixl, opt_args_set_notif_msg, "nixl_capi_opt_args_set_notif_msg", 1),
	KVB_DL_SYM(kvb_nixl, opt_args_set_has_notif, "nixl_capi_opt_args_set_has_notif", 1),
	KVB_DL_SYM(kvb_nixl, create_reg_dlist, "nixl_capi_create_reg_dlist", 1),
	KVB_DL_SYM(kvb_nixl, destroy_reg_dlist, "nixl_capi_destroy_reg_dlist", 1),
	KVB_DL_SYM(kvb_nixl, reg_dlist_add_desc, "nixl_capi_reg_dlist_add_desc", 1),
	KVB_DL_SYM(kvb_nixl, register_mem, "nixl_capi_register_mem", 1),
	KVB_DL_SYM(kvb_nixl, deregister_mem, "nixl_capi_deregister_mem", 1),
	KVB_DL_SYM(kvb_nixl, create_xfer_dlist, "nixl_capi_create_xfer_dlist", 1),
	KVB_DL_SYM(kvb_nixl, destroy_xfer_dlist, "nixl_capi_destroy_xfer_dlist", 1),
	KVB_DL_SYM(kvb_nixl, xfer_dlist_add_desc, "nixl_capi_xfer_dlist_add_desc", 1),
	KVB_DL_SYM(kvb_nixl, prep_xfer_dlist, "nixl_capi_prep_xfer_dlist", 1),
	KVB_DL_SYM(kvb_nixl, release_xfer_dlist_handle, "nixl_capi_release_xfer_dlist_handle", 1),
	KVB_DL_SYM(kvb_nixl, make_xfer_req, "nixl_capi_make_xfer_req", 1),
	KVB_DL_SYM(kvb_nixl, post_xfer_req, "nixl_capi_post_xfer_req", 1),
	KVB_DL_SYM(kvb_nixl, get_xfer_status, "nixl_capi_get_xfer_status", 1),
	KVB_DL_SYM(kvb_nixl, release_xfer_req, "nixl_capi_release_xfer_req", 1),
	KVB_DL_SYM(kvb_nixl, destroy_xfer_req, "nixl_capi_destroy_xfer_req", 1),
	KVB_DL_SYM(kvb_nixl, gen_notif, "nixl_capi_gen_notif", 1),
	KVB_DL_SYM(kvb_nixl, create_notif_map, "nixl_capi_create_notif_map", 1),
	KVB_DL_SYM(kvb_nixl, destroy_notif_map, "nixl_capi_destroy_notif_map", 1),
	KVB_DL_SYM(kvb_nixl, get_notifs, "nixl_capi_get_notifs", 1),
	KVB_DL_SYM(kvb_nixl, notif_map_size, "nixl_capi_notif_map_size", 1),
	KVB_DL_SYM(kvb_nixl, notif_map_get_agent_at, "nixl_capi_notif_map_get_agent_at", 1),
	KVB_DL_SYM(kvb_nixl, notif_map_get_notifs_size, "nixl_capi_notif_map_get_notifs_size", 1),
	KVB_DL_SYM(kvb_nixl, notif_map_get_notif, "nixl_capi_notif_map_get_notif", 1),
	KVB_DL_SYM(kvb_nixl, notif_map_clear, "nixl_capi_notif_map_clear", 1),
};

kvb_nixl *kvb_nixl_load(const char *path, char *err, size_t errlen)
{
	kvb_nixl *l = calloc(1, sizeof(*l));
	// libnixl_capi.so has no run path of its own: load its siblings first,
	// globally, so its undefined symbols resolve.
	const char *slash = strrchr(path, '/');
	if (slash != NULL) {
		char core[4096];
		snprintf(core, sizeof(core), "%.*s/libnixl.so", (int)(slash - path), path);
		if (access(core, R_OK) == 0) {
			l->core = kvb_dl_open(core, RTLD_NOW | RTLD_GLOBAL, err, errlen);
			if (l->core == NULL) {
				free(l);
				return NULL;
			}
		}
	}
	l->capi = kvb_dl_open(path, RTLD_NOW | RTLD_LOCAL, err, errlen);
	if (l->capi == NULL) {
		if (l->core) {
			dlclose(l->core);
		}
		free(l);
		return NULL;
	}
	static const kvb_dl_sym stub_sym[] = {KVB_DL_SYM(kvb_nixl, is_stub, "nixl_capi_is_stub", 1)};
	const char *missing = kvb_dl_bind(l->capi, l, stub_sym, 1);
	if (missing == NULL && l->is_stub()) {
		snprintf(err, errlen,
			 "%s is NIXL's stub C API (built without NIXL): install NIXL and point "
			 "KVBRIDGE_NIXL_LIB at its libnixl_capi.so",
			 path);
		return kvb_nixl_refuse(l);
	}
	if (missing == NULL) {
		missing = kvb_dl_bind(l->capi, l, nixl_syms, KVB_DL_LEN(nixl_syms));
	}
	if (missing != NULL) {
		snprintf(err, errlen,
			 "%s: missing symbol %s: kvbridge supports the NIXL C API "
			 "of NIXL 0.9 to 1.4 (tested with 1.4.0)",
			 path, missing);
		return kvb_nixl_refuse(l);
	}
	return l;
}

struct kvb_ucp_find {
	char path[4096];
	int found;
};

static int kvb_ucp_find_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct kvb_ucp_find *f = arg;
	const char *base = strrchr(info->dlpi_name, '/');
	base = base ? base + 1 : info->dlpi_name;
	// libucp.so.0, or a wheel's renamed libucp-<hash>.so.0.
	if (strncmp(base, "libucp.so", 9) == 0 || strncmp(base, "libucp-", 7) == 0) {
		f->found++;
		if (f->found == 1) {
			snprintf(f->path, sizeof(f->path), "%s", info->dlpi_name);
		}
	}
	return 0;
}

int kvb_loaded_ucx_version(unsigned *major, unsigned *minor, unsigned *release)
{
	struct kvb_ucp_find f = {0};
	dl_iterate_phdr(kvb_ucp_find_cb, &f);
	if (f.found == 0) {
		return 0;
	}
	void *h = dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL) {
		return 0;
	}
	void (*get)(unsigned *, unsigned *, unsigned *);
	*(void **)(&get) = dlsym(h, "ucp_get_version");
	if (get != NULL) {
		get(major, minor, release);
	}
	dlclose(h);
	return get != NULL ? f.found : 0;
}
