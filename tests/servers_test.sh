#!/bin/sh
# The test servers themselves (tests/servers/): nginx on 127.0.0.1 answers ranged GETs with 206,
# the bytes asked for and an ETag, HTTPS with the run's CA (and refuses a client without it),
# 416 past the end. The remote source's tests build on this. Skips (77) only when a server
# cannot be installed, saying so.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-servers.XXXXXX")
trap '"$here/servers/nginx.sh" stop "$work/nginx"; rm -rf "$work"' EXIT
command -v curl >/dev/null 2>&1 || {
	echo "SKIP: curl is not installed (scripts/setup-debian.sh installs it)"
	exit 77
}
mkdir -p "$work/root"
head -c 100000 /dev/urandom >"$work/root/blob.bin"
rc=0
out=$("$here/servers/nginx.sh" start "$work/nginx" "$work/root") || rc=$?
[ $rc -eq 0 ] || {
	echo "$out"
	exit $rc
}
eval "$out" # http= https= ca=
fail=0
check() { # what got want
	if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: got $2, want $3"; fail=1; fi
}
code=$(curl -s -D "$work/h" -o "$work/part" -w '%{http_code}' -r 10-19 "http://127.0.0.1:$http/blob.bin")
check "a ranged GET is 206" "$code" 206
dd if="$work/root/blob.bin" of="$work/want" bs=1 skip=10 count=10 2>/dev/null
cmp -s "$work/part" "$work/want" && check "the bytes of the range" same same ||
	check "the bytes of the range" different same
grep -qi '^etag: "' "$work/h" && check "an ETag" yes yes || check "an ETag" no yes
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$ca" -r 0-0 "https://127.0.0.1:$https/blob.bin")
check "HTTPS with the run's CA" "$code" 206
code=$(curl -s -o /dev/null -w '%{http_code}' "https://127.0.0.1:$https/blob.bin" || true)
check "HTTPS without it is refused" "$code" 000
code=$(curl -s -o /dev/null -w '%{http_code}' -r 200000-200010 "http://127.0.0.1:$http/blob.bin")
check "a range past the end is 416" "$code" 416
exit $fail
