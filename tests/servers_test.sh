#!/bin/sh
# The test servers themselves (tests/servers/): nginx on 127.0.0.1 answers ranged GETs with 206,
# the bytes asked for and an ETag, HTTPS with the run's CA (and refuses a client without it),
# 416 past the end; Ceph's S3 gateway checks SigV4 for real (403 SignatureDoesNotMatch for a
# wrong secret), stores and serves an object with ranges, HEAD and 416, and comes back after a
# restart of radosgw alone with the object still there. The remote source's tests build on
# this. Skips (77) only when a server cannot be installed, saying so.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/servers/common.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-servers.XXXXXX")
trap '"$here/servers/nginx.sh" stop "$work/nginx"; "$here/servers/rgw.sh" stop "$work/rgw"; rm -rf "$work"' EXIT
command -v curl >/dev/null 2>&1 || {
	echo "SKIP: curl is not installed (scripts/setup-debian.sh --tests installs it)"
	exit 77
}
mkdir -p "$work/root"
head -c 100000 /dev/urandom >"$work/root/blob.bin"
start_server "$here/servers/nginx.sh" start "$work/nginx" "$work/root" # http= https= ca=
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

start_server "$here/servers/rgw.sh" start "$work/rgw" # endpoint= access= secret=
s3() { # curl's own SigV4 signing; radosgw refuses a signed request without this header
	curl -s --aws-sigv4 aws:amz:us-east-1:s3 -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"
}
code=$(s3 --user "$access:$secret" -o /dev/null -w '%{http_code}' -X PUT "$endpoint/models")
check "S3: a bucket is created" "$code" 200
code=$(s3 --user "$access:$secret" -o /dev/null -w '%{http_code}' -T "$work/root/blob.bin" \
	"$endpoint/models/blob.bin")
check "S3: an object is stored" "$code" 200
code=$(s3 --user "$access:$secret" -D "$work/h3" -o "$work/part3" -w '%{http_code}' -r 10-19 \
	"$endpoint/models/blob.bin")
check "S3: a ranged GET is 206" "$code" 206
cmp -s "$work/part3" "$work/want" && check "S3: the bytes of the range" same same ||
	check "S3: the bytes of the range" different same
grep -qi '^etag: "' "$work/h3" && check "S3: an ETag" yes yes || check "S3: an ETag" no yes
code=$(s3 --user "$access:$secret" -I -o /dev/null -w '%{http_code}' "$endpoint/models/blob.bin")
check "S3: HEAD" "$code" 200
code=$(s3 --user "$access:$secret" -o /dev/null -w '%{http_code}' -r 200000-200010 \
	"$endpoint/models/blob.bin")
check "S3: a range past the end is 416" "$code" 416
body=$(s3 --user "$access:wrong-secret" -w ' %{http_code}' "$endpoint/models/blob.bin")
case $body in
*SignatureDoesNotMatch*" 403") check "S3: a wrong secret is 403 SignatureDoesNotMatch" yes yes ;;
*) check "S3: a wrong secret is 403 SignatureDoesNotMatch" "$body" yes ;;
esac
"$here/servers/rgw.sh" restart-rgw "$work/rgw"
code=$(s3 --user "$access:$secret" -o /dev/null -w '%{http_code}' -r 0-0 "$endpoint/models/blob.bin")
check "S3: after radosgw restarts, the object is served" "$code" 206
exit $fail
