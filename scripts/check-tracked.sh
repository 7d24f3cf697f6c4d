#!/usr/bin/env bash
# Fails if git tracks a built binary or a large file: any tracked file that
# is an ELF object, or larger than 1 MiB, outside a testdata/ directory.
# Checks what is in the index (what a commit would hold), not the work tree.
# Run by `make lint` (and so by `make test`).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

max=$((1 << 20))
bad=0
# "mode object stage\tpath" per tracked file; sizes in one batch.
while IFS=$'\t' read -r -d '' meta path; do
	read -r mode obj _ <<<"$meta"
	case "$mode" in 160000 | 120000) continue ;; esac # submodules, symlinks
	case "/$path" in */testdata/*) continue ;; esac
	size=$(git cat-file -s "$obj")
	if [ "$size" -gt "$max" ]; then
		echo "tracked file over 1 MiB ($size bytes): $path" >&2
		bad=1
	fi
	if [ "$size" -ge 4 ] && [ "$(git cat-file blob "$obj" | head -c 4 | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
		echo "tracked ELF binary: $path" >&2
		bad=1
	fi
done < <(git ls-files -s -z)

if [ "$bad" -ne 0 ]; then
	echo "check-tracked: build outputs and large files do not belong in git (git rm --cached them; .gitignore lists the build outputs; test data goes under testdata/)" >&2
	exit 1
fi
