#!/usr/bin/env bash
# Installs the system libraries kvbridge's tests need, where they are missing.
# Debian/Ubuntu: through apt-get (as root, or with sudo). Elsewhere it says
# what to install and fails.
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
	echo "deps: installing ${missing[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
	exit 0
fi

cat >&2 <<MSG
deps: missing ${missing[*]} and no apt-get here. Install the equivalents:
  libzmq (>= 4.3, with headers)   Fedora: zeromq-devel   Arch: zeromq   macOS: brew install zeromq
  UCX (>= 1.13, headers + ucx_perftest)   Fedora: ucx-devel   Arch: openucx   from source: https://openucx.org
  pkg-config
MSG
exit 1
