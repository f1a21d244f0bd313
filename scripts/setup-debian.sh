#!/bin/sh
# Install the Debian 12 packages kiln needs: to build and run the main job (scripts/demo.sh), or
# with --tests everything scripts/test.sh also needs (clang and its sanitizer runtimes,
# Criterion, Google Benchmark, the Python test stack, the servers the remote tests run against).
# Skips apt entirely when everything is already there, so repeated runs are quick and need no
# network.
#
#   scripts/setup-debian.sh [--tests]
set -eu

# The library, klnt and the converters: a C11 compiler, CMake, liburing, libxxhash, libcurl,
# OpenSSL's libcrypto (SHA-256), json-c; xxd turns the golden cases' hex into files.
PACKAGES="build-essential cmake pkg-config liburing-dev libxxhash-dev libcurl4-openssl-dev libssl-dev \
libjson-c-dev xxd"

# libclang-rt-14-dev holds clang's sanitizer and libFuzzer runtimes; clang only recommends it.
# python3-fsspec: kiln.safetensors._safe_open_handle is tested on fsspec's local files.
# nginx, curl, openssl, Ceph's mon, OSD and S3 gateway: the test servers on 127.0.0.1
# (tests/servers/). xxhash's xxhsum: the digests klnt writes are checked against it.
# setuptools, wheel, pip and venv: the offline `pip install .` the Python suite runs against.
TEST_PACKAGES="clang libclang-rt-14-dev clang-format libcriterion-dev libbenchmark-dev \
python3-dev python3-numpy python3-pytest python3-torch python3-fsspec \
python3-setuptools python3-wheel python3-pip python3-venv \
nginx curl openssl ceph-mon ceph-osd radosgw ceph-common xxhash"

case "${1:-}" in
"") ;;
--tests) PACKAGES="$PACKAGES $TEST_PACKAGES" ;;
*)
	echo "usage: $0 [--tests]" >&2
	exit 2
	;;
esac

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
