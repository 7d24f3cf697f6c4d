package ucx

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// abiProbe prints every offset, size and value of ucx_abi.h that the ucx
// engine relies on; compiled once against UCX's own headers and once
// against ours, the two outputs must match.
const abiProbe = `
#include <stddef.h>
#include <stdio.h>
#ifdef REAL_UCX
#include <ucp/api/ucp.h>
#else
#include "ucx_abi.h"
#endif
#define OFF(t, f) printf("offsetof(%s, %s) = %zu\n", #t, #f, offsetof(t, f))
#define VAL(v) printf("%s = %lld\n", #v, (long long)(v))
int main(void) {
	printf("sizeof(ucs_status_t) = %zu\n", sizeof(ucs_status_t));
	OFF(ucp_params_t, field_mask); OFF(ucp_params_t, features);
	OFF(ucp_worker_params_t, field_mask); OFF(ucp_worker_params_t, thread_mode);
	OFF(ucp_am_handler_param_t, field_mask); OFF(ucp_am_handler_param_t, id); OFF(ucp_am_handler_param_t, flags);
	OFF(ucp_am_handler_param_t, cb); OFF(ucp_am_handler_param_t, arg);
	OFF(ucp_am_recv_param_t, recv_attr);
	OFF(ucp_ep_params_t, field_mask); OFF(ucp_ep_params_t, address); OFF(ucp_ep_params_t, err_mode);
	OFF(ucp_ep_params_t, err_handler); OFF(ucp_ep_params_t, err_handler.cb); OFF(ucp_ep_params_t, err_handler.arg);
	OFF(ucp_mem_map_params_t, field_mask); OFF(ucp_mem_map_params_t, address); OFF(ucp_mem_map_params_t, length);
	OFF(ucp_mem_map_params_t, flags);
	OFF(ucp_mem_attr_t, field_mask); OFF(ucp_mem_attr_t, address); OFF(ucp_mem_attr_t, length);
	OFF(ucp_request_param_t, op_attr_mask); OFF(ucp_request_param_t, flags); OFF(ucp_request_param_t, request);
	OFF(ucp_request_param_t, cb); OFF(ucp_request_param_t, datatype); OFF(ucp_request_param_t, user_data);
	OFF(ucp_request_param_t, reply_buffer); OFF(ucp_request_param_t, memory_type);
	OFF(ucp_request_param_t, recv_info); OFF(ucp_request_param_t, memh);
	VAL(UCS_OK); VAL(UCS_INPROGRESS); VAL(UCS_ERR_BUSY); VAL(UCS_ERR_CANCELED); VAL(UCS_ERR_TIMED_OUT); VAL(UCS_ERR_LAST);
	VAL(UCS_THREAD_MODE_SINGLE); VAL(UCS_THREAD_MODE_SERIALIZED); VAL(UCS_THREAD_MODE_MULTI);
	VAL(UCP_ERR_HANDLING_MODE_NONE); VAL(UCP_ERR_HANDLING_MODE_PEER);
	VAL(UCP_PARAM_FIELD_FEATURES); VAL(UCP_FEATURE_RMA); VAL(UCP_FEATURE_WAKEUP); VAL(UCP_FEATURE_AM);
	VAL(UCP_WORKER_PARAM_FIELD_THREAD_MODE);
	VAL(UCP_AM_HANDLER_PARAM_FIELD_ID); VAL(UCP_AM_HANDLER_PARAM_FIELD_CB); VAL(UCP_AM_HANDLER_PARAM_FIELD_ARG);
	VAL(UCS_ERR_IO_ERROR); VAL(UCS_ERR_NO_MEMORY); VAL(UCS_ERR_INVALID_ADDR); VAL(UCS_ERR_MESSAGE_TRUNCATED); VAL(UCS_ERR_UNSUPPORTED);
	VAL(UCP_AM_RECV_ATTR_FLAG_RNDV); VAL(UCP_AM_RECV_ATTR_FLAG_DATA); VAL(UCP_AM_RECV_ATTR_FIELD_REPLY_EP); VAL(UCP_AM_SEND_FLAG_EAGER); VAL(UCP_AM_SEND_FLAG_REPLY); VAL(UCP_AM_SEND_FLAG_RNDV); VAL(UCP_EP_CLOSE_FLAG_FORCE);
	VAL(UCP_EP_PARAM_FIELD_REMOTE_ADDRESS); VAL(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE); VAL(UCP_EP_PARAM_FIELD_ERR_HANDLER);
	VAL(UCP_MEM_ATTR_FIELD_ADDRESS); VAL(UCP_MEM_ATTR_FIELD_LENGTH); VAL(UCP_MEM_MAP_ALLOCATE);
	VAL(UCP_MEM_MAP_PARAM_FIELD_ADDRESS); VAL(UCP_MEM_MAP_PARAM_FIELD_LENGTH); VAL(UCP_MEM_MAP_PARAM_FIELD_FLAGS);
	VAL(UCP_OP_ATTR_FIELD_CALLBACK); VAL(UCP_OP_ATTR_FIELD_USER_DATA); VAL(UCP_OP_ATTR_FIELD_FLAGS);
	VAL(UCP_OP_ATTR_FIELD_MEMH);
	return 0;
}
`

// TestUCXABI checks ucx_abi.h against the UCX headers installed here (the
// build needs none; the test needs them, and make test installs them). Set
// KVBRIDGE_UCX_INCLUDE to check against another UCX's include directory.
func TestUCXABI(t *testing.T) {
	inc := os.Getenv("KVBRIDGE_UCX_INCLUDE")
	if inc == "" {
		out, err := exec.Command("pkg-config", "--variable=includedir", "ucx").Output()
		if err != nil {
			t.Skip("no UCX headers to compare with (pkg-config ucx): install libucx-dev or set KVBRIDGE_UCX_INCLUDE")
		}
		inc = strings.TrimSpace(string(out))
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "probe.c")
	require.NoError(t, os.WriteFile(src, []byte(abiProbe), 0o644))
	wd, _ := os.Getwd()
	run := func(name string, flags ...string) string {
		bin := filepath.Join(dir, name)
		args := append([]string{"-o", bin, src}, flags...)
		out, err := exec.Command("gcc", args...).CombinedOutput()
		require.NoError(t, err, "gcc %v\n%s", args, out)
		out, err = exec.Command(bin).Output()
		require.NoError(t, err)
		return string(out)
	}
	real := run("real", "-DREAL_UCX", "-I"+inc)
	ours := run("ours", "-I"+wd)
	if real != ours {
		rl, ol := strings.Split(real, "\n"), strings.Split(ours, "\n")
		for i := range min(len(rl), len(ol)) {
			assert.Equal(t, rl[i], ol[i], "UCX (%s) vs ucx_abi.h", inc)
		}
	}
}
