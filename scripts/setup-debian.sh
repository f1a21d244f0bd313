#!/bin/sh
# Install the Debian 12 packages kiln needs to build, test and run. Skips apt entirely when
# everything is already there, so repeated runs are quick and need no network.
set -eu

# libclang-rt-14-dev holds clang's sanitizer and libFuzzer runtimes; clang only recommends it.
# python3-fsspec: kiln.safetensors._safe_open_handle is tested on fsspec's local files.
# nginx, curl, openssl, Ceph's mon, OSD and S3 gateway: the test servers on 127.0.0.1
# (tests/servers/).
PACKAGES="build-essential cmake pkg-config clang libclang-rt-14-dev clang-format xxd liburing-dev \
libcriterion-dev libxxhash-dev libjson-c-dev libbenchmark-dev libcurl4-openssl-dev \
python3-dev python3-numpy python3-pytest python3-torch python3-fsspec \
nginx curl openssl ceph-mon ceph-osd radosgw ceph-common"

missing=""
for p in $PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
