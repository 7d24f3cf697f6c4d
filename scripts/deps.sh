#!/usr/bin/env bash
# Installs the system libraries kvbridge's tests need, where they are missing.
# Debian/Ubuntu: through apt-get (as root, or with sudo). Elsewhere it says
# what to install and fails.
#
# Only missing packages are installed, and nothing already installed is
# upgraded unless a missing package requires it: no `apt-get upgrade`,
# `--no-upgrade` on the install, and the install is simulated first. Where
# the missing packages' dependencies need newer versions of installed
# packages (a -dev package from a newer point release than its library, e.g.
# libkrb5-dev needing the libkrb5-3 of its own version, and the packages
# built from the same source), it lists exactly those and why before it
# installs; DEPS_NO_UPGRADE=1 makes it stop there instead (then install the
# packages yourself). The package lists are refreshed (`apt-get update`) only
# when a missing package has no candidate in them, or when the install fails
# on stale lists (then it is tried once more).
set -euo pipefail

pkgs=(libzmq3-dev libucx-dev ucx-utils pkg-config)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
	for p in "${pkgs[@]}"; do
		if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
			missing+=("$p")
		fi
	done
else
	pkg-config --exists libzmq ucx 2>/dev/null && command -v ucx_perftest >/dev/null 2>&1 || missing=("${pkgs[@]}")
fi

if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: ${pkgs[*]} present"
	exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 || { echo "deps: need root to install ${missing[*]}" >&2; exit 1; }
		sudo="sudo"
	fi
	install=(apt-get install -y -qq --no-install-recommends --no-upgrade --no-remove)

	# Refresh the lists only if one of the missing packages is not in them.
	for p in "${missing[@]}"; do
		cand=$(apt-cache policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
		if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
			echo "deps: $p not in the package lists: apt-get update"
			$sudo apt-get update -qq
			break
		fi
	done

	# What the install would do: "Inst name [installed version] (new ...)"
	# is an upgrade of an installed package.
	plan=$(apt-get install -s --no-install-recommends --no-upgrade --no-remove "${missing[@]}")
	upgrades=$(awk '/^Inst [^ ]+ \[/ {v=$3; gsub(/[][]/, "", v); n=$4; sub(/^\(/, "", n); print $2 " " v " -> " n}' <<<"$plan")
	if [ -n "$upgrades" ]; then
		if [ "${DEPS_NO_UPGRADE:-}" = 1 ]; then
			cat >&2 <<MSG
deps: installing ${missing[*]} would upgrade these installed packages
(the new packages depend on their newer versions):
$(sed 's/^/  /' <<<"$upgrades")
Nothing was installed (DEPS_NO_UPGRADE=1). Install ${missing[*]} yourself,
or run without DEPS_NO_UPGRADE to allow exactly these upgrades.
MSG
			exit 1
		fi
		echo "deps: ${missing[*]} require newer versions of these installed packages; upgrading only them:"
		sed 's/^/  /' <<<"$upgrades"
	fi

	echo "deps: installing ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive $sudo "${install[@]}" "${missing[@]}"; then
		echo "deps: install failed; refreshing the package lists and trying once more"
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo "${install[@]}" "${missing[@]}"
	fi
	exit 0
fi

cat >&2 <<MSG
deps: missing ${missing[*]} and no apt-get here. Install the equivalents:
  libzmq (>= 4.3, with headers)   Fedora: zeromq-devel   Arch: zeromq   macOS: brew install zeromq
  UCX (>= 1.13, headers + ucx_perftest)   Fedora: ucx-devel   Arch: openucx   from source: https://openucx.org
  pkg-config
MSG
exit 1
