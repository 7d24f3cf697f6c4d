#!/usr/bin/env bash
# Engine write bandwidth and its CPU against its references, in one run:
#   - the nixl ucx engine between two processes, like ucx_perftest, every
#     write with its notification, on UCX-allocated ("engine") and on
#     caller-registered ("caller") memory (BenchmarkWriteCrossProcess),
#   - the same with 8 writes to the peer in flight, a chunk of 8 with the
#     notification on the last or a window of 8 (BenchmarkWriteStreamed),
#   - the same engine with both agents in one process (BenchmarkWrite /
#     BenchmarkWriteDescs; history: the earlier headline figures),
#   - ucx_perftest -t ucp_put_bw at the same sizes and transports,
#   - copy() between two buffers (BenchmarkMemcpy), the physical limit.
# Prints tables of GB/s (10^9 bytes/s), CPU seconds per GB moved (user +
# system, both processes: for kvbridge as the benchmarks report it, for
# ucx_perftest its server's and client's CPU) and ratios. Issue 24's goal:
# kvbridge's CPU per GB ≤ 1.2 × ucx_perftest's on the same transport and
# memory.
#
# The references run interleaved with kvbridge, not after it: ROUNDS
# rounds (default 3), each the Go benchmarks then every ucx_perftest case,
# and every figure is printed as min/median/max over the rounds (the
# ratios are the rounds' own ratios: kvbridge's figure of a round over the
# reference's of the same round). ucx_perftest measures memory UCX
# allocated (its host memory is mapped with UCP_MEM_MAP_ALLOCATE): it is
# the reference of the "engine" rows; the "caller" rows' reference is
# scripts/ucxput/ucxput.c, the same put stream on memory the program
# allocates and registers itself (built here against the system's UCX).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found: make deps (ucx-utils)"; exit 1; }

sizes=(4096 65536 1048576 67108864)
benchtime=${BENCHTIME:-2s}
rounds=${ROUNDS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

tls_env() {
	case $1 in
	shm) echo "UCX_TLS=posix,cma,self" ;;
	tcp) echo "UCX_TLS=tcp UCX_NET_DEVICES=lo UCX_TCP_TX_SEG_SIZE=1M UCX_TCP_RX_SEG_SIZE=1M" ;;
	esac
}

# timed FILE CMD...: runs CMD and writes the CPU seconds (user + system,
# its waited-for descendants included, to the millisecond: bash's times)
# it used to FILE.
timed() {
	local file=$1
	shift
	(
		rc=0
		"$@" || rc=$?
		# times itself, not in a pipeline (a pipeline's subshell has no children)
		times >"$file.times"
		tail -1 "$file.times" | awk '{t = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); t += p[1] * 60 + p[2] }; printf "%.3f\n", t}' >"$file"
		exit $rc
	)
}

# pair_run TRANSPORT FIELD SCALE N SERVER-CMD(N words) CLIENT-CMD... ->
# "GB/s CPU-seconds" of one run of a reference's server and client (@PORT@
# in either command is replaced by a fresh port): GB/s is field FIELD of
# the client's "Final:" line times SCALE; the CPU is the server's and the
# client's, failed client attempts (server not yet listening) left out.
pair_run() {
	local tls=$1 field=$2 scale=$3 n=$4 port=$((20000 + RANDOM % 20000))
	shift 4
	local srv_cmd=("${@:1:n}") cli_cmd=("${@:n+1}")
	srv_cmd=("${srv_cmd[@]//@PORT@/$port}")
	cli_cmd=("${cli_cmd[@]//@PORT@/$port}")
	rm -f "$out/srv.cpu" "$out/cli.cpu"
	timed "$out/srv.cpu" env $(tls_env "$tls") "${srv_cmd[@]}" >/dev/null 2>&1 &
	local srv=$!
	local line=""
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.3
		line=$(timed "$out/cli.cpu" env $(tls_env "$tls") timeout 120 "${cli_cmd[@]}" 2>/dev/null | grep '^Final:' || true)
		[ -n "$line" ] && break
	done
	wait "$srv" 2>/dev/null || true
	[ -n "$line" ] || return 0
	echo "$line" | awk -v f="$field" -v k="$scale" -v s="$(cat "$out/srv.cpu" 2>/dev/null || echo 0)" -v c="$(cat "$out/cli.cpu" 2>/dev/null || echo 0)" \
		'{printf "%.2f %.3f", $f * k, s + c}'
}

# perftest_run TRANSPORT SIZE ITERS [WINDOW]: one ucx_perftest put stream
# (it reports MiB/s: "Final: iters 50%ile avg overall bw_avg bw_overall
# ..."). WINDOW: puts in flight (-O; none: perftest's default, unbounded).
perftest_run() {
	local o=()
	[ -n "${4:-}" ] && o=(-O "$4")
	local srv=(ucx_perftest -t ucp_put_bw -s "$2" -n "$3" -p @PORT@ "${o[@]}")
	local cli=(ucx_perftest 127.0.0.1 -t ucp_put_bw -s "$2" -n "$3" -p @PORT@ "${o[@]}")
	pair_run "$1" 7 0.001048576 ${#srv[@]} "${srv[@]}" "${cli[@]}"
}

gcc -O2 -o "$out/ucxput" scripts/ucxput/ucxput.c -lucp -lucs

# ucxput_run TRANSPORT SIZE ITERS WINDOW: one put stream of the
# caller-memory reference ("Final: GB/s"), over the slots the kvbridge
# case writes: one for a write waited for, else min(8, 256 MiB / SIZE)
# (BenchmarkWriteStreamed's), so neither side rewrites memory that stays
# in cache while the other does not.
ucxput_run() {
	local slots=1
	if [ "$4" != 1 ]; then
		slots=$(((256 << 20) / $2))
		((slots > 8)) && slots=8
		((slots < 1)) && slots=1
	fi
	local srv=("$out/ucxput" server @PORT@ "$2" caller "$slots")
	pair_run "$1" 2 1 ${#srv[@]} "${srv[@]}" "$out/ucxput" client 127.0.0.1 @PORT@ "$2" "$3" caller "$4" "$slots"
}

# steady KIND TRANSPORT SIZE WINDOW BYTES NMIN NMAX -> "GB/s CPU-s/GB" of
# reference KIND (perftest or ucxput). Each process's CPU includes UCX's
# start-up and the reference's warm-up, so it runs with n and with 2n
# iterations (n: BYTES / SIZE within [NMIN, NMAX]) and the CPU per GB is
# the difference over the extra n iterations' bytes (the steady state, as
# the Go benchmarks measure it). Cached per round, transport, size and
# window.
steady() {
	local kind=$1 tls=$2 size=$3 win=$4 cache="$out/$1-$round-$2-$3-$4"
	if [ ! -s "$cache" ]; then
		local n=$(($5 / size))
		((n < $6)) && n=$6
		((n > $7)) && n=$7
		local r1 r2
		r1=$("${kind}_run" "$tls" "$size" "$n" "$win")
		r2=$("${kind}_run" "$tls" "$size" $((2 * n)) "$win")
		awk -v a="$r1" -v b="$r2" -v bytes="$((n * size))" 'BEGIN {
			split(a, x, " "); split(b, y, " ")
			if (y[1] == "") { print "n/a n/a"; exit }
			d = y[2] - x[2]
			if (x[1] == "" || d <= 0) printf "%s n/a\n", y[1]; else printf "%s %.3f\n", y[1], d / (bytes / 1e9)
		}' >"$cache"
	fi
	cat "$cache"
}

# perftest / ucxput TRANSPORT SIZE [WINDOW] -> "GB/s CPU-s/GB": ucx_perftest
# on memory UCX allocates (no WINDOW: unbounded), ucxput on memory it
# allocates and registers itself (no WINDOW: 16).
perftest() { steady perftest "$1" "$2" "${3:-}" $((8 << 30)) 200 200000; }
ucxput() { steady ucxput "$1" "$2" "${3:-16}" $((1 << 30)) 100 20000; }

for round in $(seq 1 "$rounds"); do
	echo "round $round of $rounds: go benchmarks (benchtime $benchtime), then ucx_perftest ..."
	# A failing benchmark (a write past its deadline) leaves its rows n/a and
	# is named, instead of ending the script with nothing printed.
	go test -run '^$' -bench 'BenchmarkWrite/ucx|BenchmarkWriteDescs|BenchmarkWriteCrossProcess|BenchmarkWriteStreamed|BenchmarkMemcpy' -benchtime "$benchtime" ./internal/nixl >"$out/go.all.$round" 2>/dev/null || true
	grep -E '^Benchmark.*/s' "$out/go.all.$round" >"$out/go.$round" || true
	grep -E -A2 -e '--- FAIL' "$out/go.all.$round" | grep -v '^child ' || true
	for tls in shm tcp; do
		for s in "${sizes[@]}"; do
			perftest "$tls" "$s" >/dev/null
		done
		for s in 65536 1048576 67108864; do
			for w in 1 8; do
				perftest "$tls" "$s" "$w" >/dev/null
				ucxput "$tls" "$s" "$w" >/dev/null
			done
		done
	done
done

metric() { # NAME-REGEX UNIT -> the value before UNIT on the first matching line of round $round
	grep -E "$1" "$out/go.$round" | head -1 | awk -v u="$2" '{for (i=1;i<NF;i++) if ($(i+1)==u) print $i}'
}
# mmm: the values on stdin (one per line, n/a skipped) as min/median/max.
mmm() {
	sort -g | grep -v '^n/a$' | grep -v '^$' | awk '{v[NR] = $1} END {
		if (NR == 0) { print "n/a"; exit }
		m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		if (NR == 1) printf "%s", v[1]; else printf "%s/%.2f/%s", v[1], m, v[NR]
	}'
}
# over CMD...: runs CMD once per round ($round set) and prints mmm of its
# outputs.
over() {
	for round in $(seq 1 "$rounds"); do "$@" || true; echo; done | mmm
}
gbps() { # NAME-REGEX -> GB/s from the go output (MB/s is 10^6)
	metric "$1" MB/s | awk '{printf "%.2f", $1/1000}'
}
cpu() { # NAME-REGEX -> CPU s/GB, both processes
	metric "$1" cpu-s/GB | awk '{printf "%.3f", $1}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a != "" && b+0 > 0) printf "%.2f", a/b; else print "n/a"}'; }
name() { case $1 in 4096) echo 4KiB ;; 65536) echo 64KiB ;; 1048576) echo 1MiB ;; 67108864) echo 64MiB ;; esac; }

kvb_gbps() { gbps "$1"; }
kvb_cpu() { cpu "$1"; }
# The reference of a row: ucx_perftest on engine memory, ucxput on the
# caller's (ref=perftest or ucxput), with the row's puts in flight (win;
# none: perftest's default).
ref_gbps() { "${ref:-perftest}" "$1" "$2" ${win:-} | awk '{print $1}'; }
ref_cpu() { "${ref:-perftest}" "$1" "$2" ${win:-} | awk '{print $2}'; }
gbps_ratio() { ratio "$(gbps "$1")" "$(ref_gbps "$2" "$3")"; }
cpu_ratio() { ratio "$(cpu "$1")" "$(ref_cpu "$2" "$3")"; }

row() { # SIZE-NAME TLS MEMORY CASE BENCH-REGEX SIZE
	local ref=perftest win=8
	[ "$3" = caller ] && ref=ucxput
	[ "$4" = each+notif ] && win=1
	printf '%-7s %-4s %-7s %-12s %16s %16s %16s   %16s %16s %16s\n' "$1" "$2" "$3" "$4" \
		"$(over kvb_gbps "$5")" "$(over ref_gbps "$2" "$6")" "$(over gbps_ratio "$5" "$2" "$6")" \
		"$(over kvb_cpu "$5")" "$(over ref_cpu "$2" "$6")" "$(over cpu_ratio "$5" "$2" "$6")"
}

printf '\ntwo processes next to ucx_perftest (two processes, streaming puts); GB/s and CPU s/GB (both processes), min/median/max over %s rounds\n' "$rounds"
printf '%-7s %-4s %-7s %-12s %16s %16s %16s   %16s %16s %16s\n' size tls memory case kvbridge reference ratio "CPU kvb" "CPU ref" ratio
for tls in shm tcp; do
	for s in 65536 1048576 67108864; do
		n=$(name "$s")
		for mem in engine caller; do
			row "$n" "$tls" "$mem" "each+notif" "^BenchmarkWriteCrossProcess/$tls/$mem/$n-" "$s"
			row "$n" "$tls" "$mem" "chunk of 8" "^BenchmarkWriteStreamed/$tls/$mem/$n/chunk8-" "$s"
			row "$n" "$tls" "$mem" "window of 8" "^BenchmarkWriteStreamed/$tls/$mem/$n/window8-" "$s"
		done
	done
done
cat <<'NOTE'
each+notif: every write carries its notification and is waited for; chunk of 8: 8 writes posted
back to back, the notification on the last, all waited for; window of 8: 8 writes kept in flight,
one notification per 8 writes. The reference: ucx_perftest -t ucp_put_bw for engine memory (UCX
allocates it), ucxput (scripts/ucxput) for the caller's memory, registered as kvbridge registers it;
with the case's puts in flight (each+notif: 1, the others: 8) over the case's slots (1; 8, 4 at 64 MiB).
Goals: caller memory ≥ 0.9 × the same-memory reference at 1 MiB and 64 MiB, CPU per GB
≤ 1.2 ×.
NOTE

printf '\none process, both agents (history: the figures before the two-process benchmark); GB/s and CPU s/GB, min/median/max over %s rounds\n' "$rounds"
printf '%-7s %-4s %16s %16s %16s %16s %16s %16s %16s\n' size tls kvbridge ucx_perftest ratio memcpy ratio "CPU kvb" "CPU mem"
mem_ratio() { ratio "$(gbps "$1")" "$(gbps "$2")"; }
for tls in shm tcp; do
	for s in "${sizes[@]}"; do
		n=$(name "$s")
		k="^BenchmarkWrite/ucx-$tls/$n-"
		m="^BenchmarkMemcpy/$n-"
		printf '%-7s %-4s %16s %16s %16s %16s %16s %16s %16s\n' "$n" "$tls" "$(over kvb_gbps "$k")" "$(over ref_gbps "$tls" "$s")" \
			"$(over gbps_ratio "$k" "$tls" "$s")" "$(over kvb_gbps "$m")" "$(over mem_ratio "$k" "$m")" "$(over kvb_cpu "$k")" "$(over kvb_cpu "$m")"
	done
done
for tls in shm tcp; do
	printf '\n1024 x 32 KiB descriptors over %s: %s GB/s = %s of the 64 MiB write\n' "$tls" \
		"$(over kvb_gbps "^BenchmarkWriteDescs/ucx-$tls/1024x32KiB-")" "$(over mem_ratio "^BenchmarkWriteDescs/ucx-$tls/1024x32KiB-" "^BenchmarkWrite/ucx-$tls/64MiB-")"
done
