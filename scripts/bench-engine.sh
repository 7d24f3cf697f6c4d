#!/usr/bin/env bash
# Engine write bandwidth against its references, in one run:
#   - the nixl ucx engine between two processes, like ucx_perftest, every
#     write with its notification, on UCX-allocated ("engine") and on
#     caller-registered ("caller") memory (BenchmarkWriteCrossProcess),
#   - the same engine with both agents in one process (BenchmarkWrite /
#     BenchmarkWriteDescs; history: the earlier headline figures),
#   - ucx_perftest -t ucp_put_bw at the same sizes and transports,
#   - copy() between two buffers (BenchmarkMemcpy), the physical limit.
# Prints a table of GB/s (10^9 bytes/s) and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: make deps (ucx-utils)"; exit 1; }

sizes=(4096 65536 1048576 67108864)
benchtime=${BENCHTIME:-2s}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

tls_env() {
	case $1 in
	shm) echo "UCX_TLS=posix,cma,self" ;;
	tcp) echo "UCX_TLS=tcp UCX_NET_DEVICES=lo UCX_TCP_TX_SEG_SIZE=1M UCX_TCP_RX_SEG_SIZE=1M" ;;
	esac
}

# perftest TRANSPORT SIZE -> GB/s (it reports MiB/s)
perftest() {
	local tls=$1 size=$2 port=$((20000 + RANDOM % 20000))
	local iters=$(( (2 << 30) / size ))
	((iters < 200)) && iters=200
	((iters > 200000)) && iters=200000
	env $(tls_env "$tls") ucx_perftest -t ucp_put_bw -s "$size" -n "$iters" -p "$port" >/dev/null 2>&1 &
	local srv=$!
	local line=""
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.3
		line=$(env $(tls_env "$tls") timeout 120 ucx_perftest 127.0.0.1 -t ucp_put_bw -s "$size" -n "$iters" -p "$port" 2>/dev/null | grep '^Final:' || true)
		[ -n "$line" ] && break
	done
	wait "$srv" 2>/dev/null || true
	# Final: iters 50%ile avg overall bw_avg bw_overall ...
	echo "$line" | awk '{printf "%.2f", $7 * 1048576 / 1e9}'
}

echo "running go benchmarks (benchtime $benchtime) ..."
go test -run '^$' -bench 'BenchmarkWrite/ucx|BenchmarkWriteDescs|BenchmarkWriteCrossProcess|BenchmarkMemcpy' -benchtime "$benchtime" ./nixl 2>/dev/null \
	| grep -E '^Benchmark' >"$out/go.txt"

gbps() { # NAME-REGEX -> GB/s from the go output (MB/s is 10^6)
	grep -E "$1" "$out/go.txt" | head -1 | awk '{for (i=1;i<=NF;i++) if ($(i+1)=="MB/s") printf "%.2f", $i/1000}'
}
name() { case $1 in 4096) echo 4KiB ;; 65536) echo 64KiB ;; 1048576) echo 1MiB ;; 67108864) echo 64MiB ;; esac; }

printf '\ntwo processes, each write with its notification, next to ucx_perftest (two processes, streaming puts)\n'
printf '%-10s %-6s %-7s %12s %14s %8s\n' size tls memory "kvbridge" "ucx_perftest" ratio
for tls in shm tcp; do
	for s in 65536 1048576 67108864; do
		n=$(name "$s")
		p=$(perftest "$tls" "$s")
		for mem in engine caller; do
			k=$(gbps "^BenchmarkWriteCrossProcess/$tls/$mem/$n-")
			printf '%-10s %-6s %-7s %9s GB/s %9s GB/s %8s\n' "$n" "$tls" "$mem" "$k" "${p:-n/a}" \
				"$(awk -v a="$k" -v b="$p" 'BEGIN{if (b>0) printf "%.2f", a/b; else print "n/a"}')"
		done
	done
done

printf '\none process, both agents (history: the figures before the two-process benchmark)\n'
printf '%-10s %-6s %12s %14s %8s %12s %8s\n' size tls "kvbridge" "ucx_perftest" ratio memcpy ratio
for tls in shm tcp; do
	for s in "${sizes[@]}"; do
		n=$(name "$s")
		k=$(gbps "^BenchmarkWrite/ucx-$tls/$n-")
		p=$(perftest "$tls" "$s")
		m=$(gbps "^BenchmarkMemcpy/$n-")
		printf '%-10s %-6s %9s GB/s %9s GB/s %8s %7s GB/s %8s\n' "$n" "$tls" "$k" "${p:-n/a}" \
			"$(awk -v a="$k" -v b="$p" 'BEGIN{if (b>0) printf "%.2f", a/b; else print "n/a"}')" "$m" \
			"$(awk -v a="$k" -v b="$m" 'BEGIN{if (b>0) printf "%.2f", a/b}')"
	done
done
for tls in shm tcp; do
	d=$(gbps "^BenchmarkWriteDescs/ucx-$tls/1024x32KiB-")
	w=$(gbps "^BenchmarkWrite/ucx-$tls/64MiB-")
	printf '\n1024 x 32 KiB descriptors over %s: %s GB/s = %s of the 64 MiB write\n' "$tls" "$d" \
		"$(awk -v a="$d" -v b="$w" 'BEGIN{if (b>0) printf "%.2f", a/b}')"
done
