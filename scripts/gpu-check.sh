#!/usr/bin/env bash
# GPU check for kvbridge (discovery, allocation, cross-process VRAM transfers
# verified byte for byte, bandwidth next to cuMemcpyDtoD).
#
#   scripts/gpu-check.sh build [DIR]   # here, with Go: binary + its shared
#                                      # libraries into DIR (default dist/gpucheck)
#   DIR/run.sh [gpucheck flags]        # on the GPU node: no Go, no network
#
# The bundle carries libucp/libucs/libuct/libucm and UCX's transport modules
# from this machine, so the GPU node needs only the NVIDIA driver
# (libcuda.so.1, libnvidia-ml.so.1). It runs in well under 5 minutes, then
# (where a GPU device is present) gpucheck -layerwise, issue 25's layer-wise
# TTFT benchmark with CUDA events, into gpucheck-layerwise.json.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-build}
dir=${2:-dist/gpucheck}

case $mode in
build)
	mkdir -p "$dir/lib/ucx"
	CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}" go build -o "$dir/gpucheck" ./examples/gpucheck
	# Shared libraries the binary links that a bare GPU node may lack.
	for lib in $(ldd "$dir/gpucheck" | awk '/=> \// {print $3}' | grep -E 'libuc[pstm]|libnuma|librdmacm|libibverbs' || true); do
		cp -L "$lib" "$dir/lib/"
	done
	moddir=$(pkg-config --variable=libdir ucx 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/ucx
	[ -d "$moddir" ] && cp -L "$moddir"/*.so* "$dir/lib/ucx/" 2>/dev/null || true
	cat >"$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the kvbridge GPU check with the bundled libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$here/lib/ucx"
export UCX_WARN_UNUSED_ENV_VARS=n
timeout 300 "$here/gpucheck" -json "$here/gpucheck.json" "$@"
# Issue 25's layer-wise benchmark on the device: each layer's post gated by
# the CUDA event recorded after its compute (cuMemcpyDtoDAsync on a stream
# standing in for the kernel), against the whole chunk; only where a GPU
# device is present (GPUCHECK_LAYERWISE=0 skips it).
if [ "${GPUCHECK_LAYERWISE:-1}" != 0 ] && { [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; }; then
	timeout 300 "$here/gpucheck" -layerwise -json "$here/gpucheck-layerwise.json"
else
	echo "gpucheck -layerwise skipped (no GPU device, or GPUCHECK_LAYERWISE=0)"
fi
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
