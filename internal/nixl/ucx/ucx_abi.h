// The part of UCX's UCP API the ucx engine uses, declared here so that
// kvbridge builds without UCX's headers and loads libucp at run time (like
// the NIXL C API and the CUDA driver): a process that uses only the libnixl
// engine then maps no UCX but the one NIXL brings, and importers need no
// UCX to build. Layouts and values are UCP's ABI, stable across UCX 1.x
// (structs only grow at the end, and UCX reads a field only when its bit is
// set in field_mask); TestUCXABI compares them with the installed headers
// where those exist. Each struct ends in reserved space so a newer UCX that
// reads further stays inside zeroed memory.
#ifndef KVB_UCX_ABI_H
#define KVB_UCX_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int8_t ucs_status_t; // a packed enum in UCX: one byte
typedef void *ucs_status_ptr_t;
typedef struct ucp_context *ucp_context_h;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_mem *ucp_mem_h;
typedef struct ucp_rkey *ucp_rkey_h;
typedef struct ucp_config ucp_config_t;
typedef struct ucp_address ucp_address_t;
typedef uint64_t ucp_datatype_t;

enum {
	UCS_OK = 0,
	UCS_INPROGRESS = 1,
	UCS_ERR_IO_ERROR = -3,
	UCS_ERR_NO_MEMORY = -4,
	UCS_ERR_INVALID_ADDR = -7,
	UCS_ERR_MESSAGE_TRUNCATED = -9,
	UCS_ERR_UNSUPPORTED = -22,
	UCS_ERR_BUSY = -15,
	UCS_ERR_CANCELED = -16,
	UCS_ERR_TIMED_OUT = -20,
	UCS_ERR_LAST = -100,
};
#define UCS_PTR_IS_ERR(_ptr) (((uintptr_t)(_ptr)) >= ((uintptr_t)UCS_ERR_LAST))
#define UCS_PTR_IS_PTR(_ptr) (((uintptr_t)(_ptr) - 1) < ((uintptr_t)UCS_ERR_LAST - 1))
#define UCS_PTR_RAW_STATUS(_ptr) ((ucs_status_t)(intptr_t)(_ptr))
#define UCS_PTR_STATUS(_ptr) (UCS_PTR_IS_PTR(_ptr) ? UCS_INPROGRESS : UCS_PTR_RAW_STATUS(_ptr))

enum { UCS_THREAD_MODE_SINGLE = 0, UCS_THREAD_MODE_SERIALIZED = 1, UCS_THREAD_MODE_MULTI = 2 };
enum { UCP_ERR_HANDLING_MODE_NONE = 0, UCP_ERR_HANDLING_MODE_PEER = 1 };

#define KVBU_BIT(i) (1ull << (i))
enum {
	UCP_PARAM_FIELD_FEATURES = KVBU_BIT(0),
	UCP_FEATURE_RMA = KVBU_BIT(1),
	UCP_FEATURE_WAKEUP = KVBU_BIT(4),
	UCP_FEATURE_AM = KVBU_BIT(6),
	UCP_WORKER_PARAM_FIELD_THREAD_MODE = KVBU_BIT(0),
	UCP_AM_HANDLER_PARAM_FIELD_ID = KVBU_BIT(0),
	UCP_AM_HANDLER_PARAM_FIELD_CB = KVBU_BIT(2),
	UCP_AM_HANDLER_PARAM_FIELD_ARG = KVBU_BIT(3),
	UCP_AM_RECV_ATTR_FIELD_REPLY_EP = KVBU_BIT(0),
	UCP_AM_RECV_ATTR_FLAG_DATA = KVBU_BIT(16),
	UCP_AM_RECV_ATTR_FLAG_RNDV = KVBU_BIT(17),
	UCP_AM_SEND_FLAG_REPLY = KVBU_BIT(0),
	UCP_AM_SEND_FLAG_EAGER = KVBU_BIT(1),
	UCP_AM_SEND_FLAG_RNDV = KVBU_BIT(2),
	UCP_EP_CLOSE_FLAG_FORCE = KVBU_BIT(0),
	UCP_EP_PARAM_FIELD_REMOTE_ADDRESS = KVBU_BIT(0),
	UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE = KVBU_BIT(1),
	UCP_EP_PARAM_FIELD_ERR_HANDLER = KVBU_BIT(2),
	UCP_MEM_ATTR_FIELD_ADDRESS = KVBU_BIT(0),
	UCP_MEM_ATTR_FIELD_LENGTH = KVBU_BIT(1),
	UCP_MEM_MAP_ALLOCATE = KVBU_BIT(1),
	UCP_MEM_MAP_PARAM_FIELD_ADDRESS = KVBU_BIT(0),
	UCP_MEM_MAP_PARAM_FIELD_LENGTH = KVBU_BIT(1),
	UCP_MEM_MAP_PARAM_FIELD_FLAGS = KVBU_BIT(2),
	UCP_OP_ATTR_FIELD_CALLBACK = KVBU_BIT(1),
	UCP_OP_ATTR_FIELD_USER_DATA = KVBU_BIT(2),
	UCP_OP_ATTR_FIELD_FLAGS = KVBU_BIT(4),
	UCP_OP_ATTR_FIELD_MEMH = KVBU_BIT(8),
};

#define KVBU_RESERVED char kvbu_reserved[256]

typedef struct ucp_params {
	uint64_t field_mask;
	uint64_t features;
	KVBU_RESERVED;
} ucp_params_t;

typedef struct ucp_worker_params {
	uint64_t field_mask;
	int thread_mode;
	KVBU_RESERVED;
} ucp_worker_params_t;

typedef struct ucp_am_recv_param {
	uint64_t recv_attr;
	ucp_ep_h reply_ep;
} ucp_am_recv_param_t;

typedef ucs_status_t (*ucp_am_recv_callback_t)(void *arg, const void *header, size_t header_length, void *data,
					       size_t length, const ucp_am_recv_param_t *param);

typedef struct ucp_am_handler_param {
	uint64_t field_mask;
	unsigned id;
	uint32_t flags;
	ucp_am_recv_callback_t cb;
	void *arg;
	KVBU_RESERVED;
} ucp_am_handler_param_t;

typedef void (*ucp_err_handler_cb_t)(void *arg, ucp_ep_h ep, ucs_status_t status);
typedef struct ucp_err_handler {
	ucp_err_handler_cb_t cb;
	void *arg;
} ucp_err_handler_t;

typedef struct ucp_ep_params {
	uint64_t field_mask;
	const ucp_address_t *address;
	int err_mode;
	ucp_err_handler_t err_handler;
	KVBU_RESERVED;
} ucp_ep_params_t;

typedef struct ucp_mem_map_params {
	uint64_t field_mask;
	void *address;
	size_t length;
	unsigned flags;
	KVBU_RESERVED;
} ucp_mem_map_params_t;

typedef struct ucp_mem_attr {
	uint64_t field_mask;
	void *address;
	size_t length;
	KVBU_RESERVED;
} ucp_mem_attr_t;

typedef void (*ucp_send_nbx_callback_t)(void *request, ucs_status_t status, void *user_data);
typedef struct {
	uint32_t op_attr_mask;
	uint32_t flags;
	void *request;
	union {
		ucp_send_nbx_callback_t send;
		void *any;
	} cb;
	ucp_datatype_t datatype;
	void *user_data;
	void *reply_buffer;
	int memory_type;
	union {
		size_t *length;
		void *tag_info;
	} recv_info;
	ucp_mem_h memh;
	KVBU_RESERVED;
} ucp_request_param_t;

// The functions, resolved by kvbu_load. The members are named as UCP's
// functions, so the engine reads kvbu.ucp_put_nbx(...).
typedef struct kvbu_api {
	void (*ucp_get_version)(unsigned *, unsigned *, unsigned *);
	ucs_status_t (*ucp_config_read)(const char *, const char *, ucp_config_t **);
	ucs_status_t (*ucp_config_modify)(ucp_config_t *, const char *, const char *);
	void (*ucp_config_release)(ucp_config_t *);
	ucs_status_t (*ucp_init_version)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *,
					 ucp_context_h *);
	void (*ucp_cleanup)(ucp_context_h);
	ucs_status_t (*ucp_worker_create)(ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *);
	void (*ucp_worker_destroy)(ucp_worker_h);
	ucs_status_t (*ucp_worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
	void (*ucp_worker_release_address)(ucp_worker_h, ucp_address_t *);
	unsigned (*ucp_worker_progress)(ucp_worker_h);
	ucs_status_t (*ucp_worker_get_efd)(ucp_worker_h, int *);
	ucs_status_t (*ucp_worker_arm)(ucp_worker_h);
	ucs_status_t (*ucp_worker_set_am_recv_handler)(ucp_worker_h, const ucp_am_handler_param_t *);
	ucs_status_t (*ucp_ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
	ucs_status_ptr_t (*ucp_ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
	ucs_status_ptr_t (*ucp_ep_flush_nbx)(ucp_ep_h, const ucp_request_param_t *);
	ucs_status_t (*ucp_ep_rkey_unpack)(ucp_ep_h, const void *, ucp_rkey_h *);
	void (*ucp_ep_print_info)(ucp_ep_h, FILE *);
	ucs_status_ptr_t (*ucp_put_nbx)(ucp_ep_h, const void *, size_t, uint64_t, ucp_rkey_h,
					const ucp_request_param_t *);
	ucs_status_ptr_t (*ucp_get_nbx)(ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *);
	ucs_status_ptr_t (*ucp_am_send_nbx)(ucp_ep_h, unsigned, const void *, size_t, const void *, size_t,
					    const ucp_request_param_t *);
	ucs_status_t (*ucp_mem_map)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);
	ucs_status_t (*ucp_mem_unmap)(ucp_context_h, ucp_mem_h);
	ucs_status_t (*ucp_mem_query)(const ucp_mem_h, ucp_mem_attr_t *);
	ucs_status_t (*ucp_rkey_pack)(ucp_context_h, ucp_mem_h, void **, size_t *);
	void (*ucp_rkey_buffer_release)(void *);
	ucs_status_t (*ucp_rkey_ptr)(ucp_rkey_h, uint64_t, void **);
	void (*ucp_rkey_destroy)(ucp_rkey_h);
	ucs_status_t (*ucp_request_check_status)(void *);
	void (*ucp_request_cancel)(ucp_worker_h, void *);
	void (*ucp_request_free)(void *);
	const char *(*ucs_status_string)(ucs_status_t);
} kvbu_api;

extern kvbu_api kvbu;

// kvbu_load loads libucp from path (dlopen; a libucp.so.0 already in the
// process is reused) and resolves kvbu. 0 on success; otherwise it writes
// why into err.
int kvbu_load(const char *path, char *err, size_t errlen);

#endif
