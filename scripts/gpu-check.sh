#!/usr/bin/env bash
# GPU check for kvbridge (discovery, allocation, cross-process VRAM transfers
# verified byte for byte, bandwidth next to cuMemcpyDtoD).
#
#   scripts/gpu-check.sh build [DIR]   # here, with Go: gpucheck, kvbench and
#                                      # their shared libraries into DIR
#                                      # (default dist/gpucheck)
#   DIR/run.sh [gpucheck flags]        # on the GPU node: no Go, no network
#
# The bundle carries the binaries' libraries (ZeroMQ and its dependencies,
# all but glibc's own), UCX (libucp/libucs/libuct/libucm, which the ucx
# engine loads at run time) and UCX's transport modules from this machine,
# so the GPU node needs only the NVIDIA driver (libcuda.so.1,
# libnvidia-ml.so.1). gpucheck runs in well under 5 minutes; then, where a
# GPU device is present, gpucheck -layerwise (issue 25's layer-wise TTFT
# benchmark with CUDA events) into gpucheck-layerwise.json, and kvbench
# -mem VRAM (issue 22: engine, paged and rooms modes with the ranks' KV in
# device memory, against cuMemcpyDtoD) on the ucx and loopback engines, and
# on libnixl when KVBRIDGE_NIXL_LIB names a NIXL with CUDA support, into
# kvbench-vram-ENGINE.json and .png; each run is bounded to 4 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-build}
dir=${2:-dist/gpucheck}

case $mode in
build)
	mkdir -p "$dir/lib/ucx" "$dir/lib/ucx-libs"
	for cmd in gpucheck kvbench; do
		CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}" go build -o "$dir/$cmd" "./examples/$cmd"
	done
	# UCX, loaded at run time by the ucx engine, into lib/ucx-libs: the
	# libnixl run leaves it out of its path (one UCX per process: NIXL's).
	ucx=()
	for so in libucp.so.0 libucs.so.0 libuct.so.0 libucm.so.0; do
		p=$(/sbin/ldconfig -p | awk -v n="$so" '$1 == n && p == "" {p = $NF} END {print p}')
		[ -n "$p" ] && cp -L "$p" "$dir/lib/ucx-libs/" && ucx+=("$p")
	done
	moddir=$(pkg-config --variable=libdir ucx 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/ucx
	[ -d "$moddir" ] && cp -L "$moddir"/*.so.0 "$dir/lib/ucx/" 2>/dev/null || true
	# Shared libraries the binaries, UCX and its modules link that a bare
	# GPU node may lack: all but glibc's own (and UCX's, above).
	for lib in $(ldd "$dir/gpucheck" "$dir/kvbench" "${ucx[@]}" "$dir"/lib/ucx/*.so.0 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
		grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libuc[pstm](_[a-z]+)?)\.so' || true); do
		cp -L "$lib" "$dir/lib/"
	done
	cat >"$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the kvbridge GPU check with the bundled libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
user_ld=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH="$here/lib:$here/lib/ucx-libs${user_ld:+:$user_ld}"
export UCX_MODULE_DIR="$here/lib/ucx"
export UCX_WARN_UNUSED_ENV_VARS=n
timeout 300 "$here/gpucheck" -json "$here/gpucheck.json" "$@"
gpu_device() { [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; }
# Issue 25's layer-wise benchmark on the device: each layer's post gated by
# the CUDA event recorded after its compute (cuMemcpyDtoDAsync on a stream
# standing in for the kernel), against the whole chunk; only where a GPU
# device is present (GPUCHECK_LAYERWISE=0 skips it).
if [ "${GPUCHECK_LAYERWISE:-1}" != 0 ] && gpu_device; then
	timeout 300 "$here/gpucheck" -layerwise -json "$here/gpucheck-layerwise.json"
else
	echo "gpucheck -layerwise skipped (no GPU device, or GPUCHECK_LAYERWISE=0)"
fi
# Issue 22's kvbench -mem VRAM: the ranks' KV memory on device 0, every
# figure against cuMemcpyDtoD on the device, on each engine that moves
# VRAM; only where a GPU device is present (GPUCHECK_KVBENCH=0 skips it;
# =1 runs it anyway, for tests on the CUDA driver double). KVBENCH_FLAGS
# adds flags (-quick). The libnixl run has the user's LD_LIBRARY_PATH
# first and neither the bundle's UCX nor its modules: NIXL brings its own.
failed=0
kvbench_vram() {
	local engine=$1
	shift
	echo "kvbench -mem VRAM -engine $engine"
	# shellcheck disable=SC2086 # KVBENCH_FLAGS is a list of flags
	if ! timeout 240 "$@" "$here/kvbench" -mem VRAM -engine "$engine" ${KVBENCH_FLAGS:-} \
		-json "$here/kvbench-vram-$engine.json" -png "$here/kvbench-vram-$engine.png"; then
		echo "kvbench -mem VRAM -engine $engine: FAIL"
		failed=1
	fi
}
if [ "${GPUCHECK_KVBENCH:-}" = 1 ] || { [ "${GPUCHECK_KVBENCH:-}" != 0 ] && gpu_device; }; then
	kvbench_vram ucx
	kvbench_vram loopback
	if [ -n "${KVBRIDGE_NIXL_LIB:-}" ]; then
		kvbench_vram libnixl env -u UCX_MODULE_DIR LD_LIBRARY_PATH="${user_ld:+$user_ld:}$here/lib"
	else
		echo "kvbench -mem VRAM -engine libnixl skipped (KVBRIDGE_NIXL_LIB is not set)"
	fi
else
	echo "kvbench -mem VRAM skipped (no GPU device, or GPUCHECK_KVBENCH=0)"
fi
exit "$failed"
RUN
	chmod +x "$dir/run.sh"
	echo "built $dir (copy it to the GPU node and run $dir/run.sh)"
	du -sh "$dir"
	;;
*)
	echo "usage: $0 build [DIR]" >&2
	exit 2
	;;
esac
