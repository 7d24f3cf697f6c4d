#!/usr/bin/env bash
# make mutants: the kvmanager package's tests, once per mutant (a known bug
# brought back, see kvmanager/mutants.go) turned on in every core of the
# test process. Each mutant must make some test fail; one that survives
# fails this script. The tests are compiled once, with -tags kvbmutants.
set -euo pipefail
cd "$(dirname "$0")/../kvmanager"
bin=$(mktemp -d)/kvmanager.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -tags kvbmutants -o "$bin" .
mapfile -t mutants < <("$bin" -test.run '^TestMutantList$' -test.v | sed -n 's/.*mutant \([0-9]*\) \(.*\)$/\1 \2/p')
[ ${#mutants[@]} -gt 0 ] || { echo "mutants: none listed" >&2; exit 1; }
survived=0
for m in "${mutants[@]}"; do
	id=${m%% *}; name=${m#* }
	start=$(date +%s)
	if out=$(KVBRIDGE_MUTANT=$id "$bin" -test.count=1 -test.failfast -test.timeout 20m 2>&1); then
		printf 'mutant %2d %-26s SURVIVED every test (%ds)\n' "$id" "$name" $(($(date +%s) - start))
		survived=$((survived + 1))
	else
		by=$(grep -m1 -E '^--- FAIL' <<<"$out" | sed -E 's/^--- FAIL: ([^ ]+).*/\1/')
		printf 'mutant %2d %-26s caught by %s (%ds)\n' "$id" "$name" "${by:-a failing run}" $(($(date +%s) - start))
	fi
done
echo "${#mutants[@]} mutants, $survived survived"
[ "$survived" -eq 0 ]
# The source mutants of packages without a built-in switch (bootstrap's
# envelope checks), laid over the real files with go test -overlay.
cd ..
go run ./scripts/srcmutants
