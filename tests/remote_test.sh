#!/bin/sh
# The REMOTE source against real servers on 127.0.0.1: nginx (HTTP and HTTPS with a CA of the
# run's own), Ceph's S3 gateway (SigV4 checked for real) and tests/servers/faultproxy.py in front
# of nginx for the servers that misbehave. Writes the fixtures, serves them from nginx's root and
# uploads them to a bucket, runs test_remote (tests/test_remote.c) and then klnt on URLs.
# Skips (77) only when a server cannot be installed, saying so.
#
#   tests/remote_test.sh TEST_REMOTE KLNT WORKDIR [CRITERION OPTION]...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/servers/common.sh"
test_remote=$1
klnt=$2
work=$3
shift 3
rm -rf "$work"
mkdir -p "$work/root" "$work/proxy"
proxy_pid=
cleanup() {
	[ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null || true
	"$here/servers/nginx.sh" stop "$work/nginx" || true
	"$here/servers/rgw.sh" stop "$work/rgw" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
command -v curl >/dev/null 2>&1 || {
	echo "SKIP: curl is not installed (scripts/setup-debian.sh --tests installs it)"
	exit 77
}

# The fixtures: a KLNT file of many 1 MiB ranges, one whose directory passes the first GET's
# 256 KiB, the stock samples (GGUF, a sharded safetensors checkpoint with its index), a KLNT
# series, a series with a shard missing, an empty object and one of no format.
root=$work/root
"$klnt" gen "$root/m.klnt" --tensors 300 --bytes 24M --no-sync >/dev/null
"$klnt" gen "$root/big-dir.klnt" --tensors 3000 --unnamed --bytes 4M --no-sync >/dev/null
cp "$here/samples/tiny-llama.gguf" "$root/"
mkdir -p "$root/tiny-sharded"
cp "$here/samples/tiny-sharded/"* "$root/tiny-sharded/"
"$klnt" import -o "$root/series.klnt" --max-shard-size 32K --no-sync \
	"$here/samples/tiny-llama.gguf" >/dev/null
[ -f "$root/series-00003-of-00003.klnt" ] || {
	echo "FAIL: the KLNT series fixture is not 3 shards"
	exit 1
}
cp "$root/m.klnt" "$root/gap-00001-of-00002.klnt"
/usr/bin/python3 - "$root/m.safetensors" <<'EOF'
import json, random, struct, sys
random.seed(7)
specs = [("a", "F32", [64, 32], 4), ("b", "F16", [128], 2), ("c", "I32", [7, 3], 4)]
header, data = {}, b""
for name, dtype, shape, size in specs:
    n = size
    for d in shape:
        n *= d
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
    data += bytes(random.getrandbits(8) & 0x3f for _ in range(n))
h = json.dumps(header).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
EOF
: >"$root/empty.klnt"
echo "hello, not a model, and long enough to be judged by its first bytes alone" >"$root/text.txt"
# Another version of m.klnt: the same size, other bytes, another modification time (the proxy's
# noetag-flip mode serves it after the first request).
cp "$root/m.klnt" "$root/m-flip.klnt"
printf 'flipped!' | dd of="$root/m-flip.klnt" bs=1 seek=2000000 conv=notrunc status=none
touch -d '2001-01-01' "$root/m-flip.klnt"
# An index whose shards leave its directory once decoded (nginx serves /sub/%2e%2e/m.safetensors
# as /m.safetensors), for the resolver to refuse.
mkdir -p "$root/sub"
printf '{"weight_map":{"a":"%%2e%%2e/m.safetensors","b":"%%2e%%2e/m.safetensors","c":"%%2e%%2e/m.safetensors"}}' \
	>"$root/sub/model.safetensors.index.json"

start_server "$here/servers/nginx.sh" start "$work/nginx" "$root" # http= https= ca=
/usr/bin/python3 "$here/servers/faultproxy.py" "$http" "$work/proxy" &
proxy_pid=$!
start_server "$here/servers/rgw.sh" start "$work/rgw" # endpoint= access= secret=
s3() { # curl's own SigV4 signing; radosgw refuses a signed request without this header
	curl -sf --aws-sigv4 aws:amz:us-east-1:s3 -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
		--user "$access:$secret" "$@"
}
s3 -X PUT "$endpoint/models" -o /dev/null
(cd "$root" && find . -type f | sed 's|^\./||') | while read -r f; do
	s3 -T "$root/$f" "$endpoint/models/$f" -o /dev/null || {
		echo "FAIL: cannot upload $f"
		exit 1
	}
done
# An S3 key with a ".." segment is a name: its object is not the one the key would be without
# the segment (y.klnt, another model).
s3 --path-as-is -T "$here/samples/tiny-llama.gguf" "$endpoint/models/dots/../y.klnt" -o /dev/null
s3 -T "$root/m.klnt" "$endpoint/models/y.klnt" -o /dev/null
i=0
while [ ! -f "$work/proxy/port" ] && [ $i -lt 100 ]; do
	sleep 0.1
	i=$((i + 1))
done
proxy_port=$(cat "$work/proxy/port")

export KILN_TEST_ROOT="$root" KILN_TEST_HTTP="http://127.0.0.1:$http" \
	KILN_TEST_HTTPS="https://127.0.0.1:$https" KILN_TEST_CA="$ca" \
	KILN_TEST_PROXY="http://127.0.0.1:$proxy_port" KILN_TEST_S3_ENDPOINT="$endpoint" \
	KILN_TEST_S3_ACCESS="$access" KILN_TEST_S3_SECRET="$secret" \
	KILN_TEST_RGW_RESTART="$here/servers/rgw.sh restart-rgw $work/rgw >/dev/null"
unset CURL_CA_BUNDLE AWS_CA_BUNDLE
"$test_remote" --jobs 2 "$@"

# Python, where the module was built beside klnt. A sanitized module needs the ASan runtime
# preloaded into the interpreter (python/CMakeLists.txt does that for the python suite): here
# the URL paths it takes are the C ones test_remote has just run under ASan, so it is left out.
py=$(dirname "$klnt")/python
if [ -d "$py/kiln" ] && /usr/bin/python3 -c 'import pytest' 2>/dev/null; then
	if nm -D "$py"/kiln/_kiln*.so 2>/dev/null | grep -q __asan_init; then
		echo "note: python/tests/test_remote.py not run: the module is built with ASan"
	else
		PYTHONPATH="$py" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
			"$here/../python/tests/test_remote.py"
	fi
fi

# klnt on URLs: the same verdicts and bytes as on the files, and a wrong secret's error.
fail=0
check() { # what got want
	if [ "$2" = "$3" ]; then echo "ok: $1"; else echo "FAIL: $1: got '$2', want '$3'"; fail=1; fi
}
# verdict WHAT STATUS PATTERN COMMAND...: COMMAND exits with STATUS, and what it prints (stdout
# and stderr) matches the case pattern PATTERN.
verdict() {
	what=$1 want=$2 pat=$3
	shift 3
	rc=0
	out=$("$@" 2>&1) || rc=$?
	check "$what: exit status" "$rc" "$want"
	case $out in
	$pat) check "$what" yes yes ;;
	*) check "$what ($out)" no yes ;;
	esac
}
export AWS_ACCESS_KEY_ID="$access" AWS_SECRET_ACCESS_KEY="$secret" AWS_ENDPOINT_URL="$endpoint"
for f in m.klnt tiny-llama.gguf tiny-sharded/model.safetensors.index.json series-00001-of-00003.klnt; do
	got=$("$klnt" check "s3://models/$f" | sed "s|s3://models/||")
	want=$("$klnt" check "$root/$f" | sed "s|$root/||")
	check "klnt check s3://models/$f" "$got" "$want"
	got=$("$klnt" inspect "http://127.0.0.1:$http/$f" | sed "s|http://127.0.0.1:$http/||" | cksum)
	want=$("$klnt" inspect "$root/$f" | sed "s|$root/||" | cksum)
	check "klnt inspect http://.../$f" "$got" "$want"
done
got=$("$klnt" cat "s3://models/m.klnt" blk.7.ffn_up.weight | cksum)
want=$("$klnt" cat "$root/m.klnt" blk.7.ffn_up.weight | cksum)
check "klnt cat s3://" "$got" "$want"
got=$(CURL_CA_BUNDLE="$ca" "$klnt" cat --rows 1:3 "https://127.0.0.1:$https/m.klnt" \
	blk.1.attn_qkv.weight | cksum)
want=$("$klnt" cat --rows 1:3 "$root/m.klnt" blk.1.attn_qkv.weight | cksum)
check "klnt cat --rows https://" "$got" "$want"
rc=0
out=$(AWS_SECRET_ACCESS_KEY=wrong "$klnt" check s3://models/m.klnt 2>&1) || rc=$?
last=$(echo "$out" | tail -n 1)
check "a wrong secret: exit status" "$rc" 3
case $last in
*"403 SignatureDoesNotMatch"*) check "a wrong secret: the last line" yes yes ;;
*) check "a wrong secret: the last line ($last)" no yes ;;
esac

# A URL's password and query (a presigned signature) appear in none of klnt's messages.
out=$("$klnt" check "http://user:pa55word@127.0.0.1:$proxy_port/404/x.klnt?X-Amz-Signature=5ecret5ig" 2>&1) || true
case $out in *pa55word* | *5ecret5ig*) check "klnt leaves a URL's credentials out ($out)" no yes ;;
*"x.klnt?..."*) check "klnt leaves a URL's credentials out" yes yes ;;
*) check "klnt names the URL without its credentials ($out)" no yes ;; esac

# --timeout ends an operation a dripping server would hold for ever, naming the URL.
rc=0
out=$(timeout 60 "$klnt" --timeout 2 check "http://127.0.0.1:$proxy_port/drip/m.klnt" 2>&1) || rc=$?
check "klnt --timeout: exit status" "$rc" 3
case $out in *"/drip/m.klnt"*deadline*) check "klnt --timeout: the message" yes yes ;;
*) check "klnt --timeout: the message ($out)" no yes ;; esac

# Interrupted, klnt load of a URL stops within a poll of the GETs in flight, not when they end
# (about 48 s at the proxy's 64 KiB/s a connection). SIGTERM: a background job of a
# non-interactive shell ignores SIGINT, and klnt takes both the same way.
"$klnt" load "http://127.0.0.1:$proxy_port/slow:$$/m.klnt" >/dev/null 2>&1 &
pid=$!
sleep 2
t0=$(date +%s%N)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
check "klnt load interrupted: exit status" "$rc" 143
if [ "$ms" -lt 3000 ]; then check "klnt load stops within 3 s of the signal" yes yes
else check "klnt load stops within 3 s of the signal (${ms} ms)" no yes; fi

# A cache directory others may write is not used, and klnt says why; the check still passes.
shared_cache="$work/shared-cache"
mkdir -p "$shared_cache" && chmod 0777 "$shared_cache"
rc=0
out=$(KILN_CACHE_DIR="$shared_cache" "$klnt" check s3://models/m.klnt 2>&1) || rc=$?
check "klnt with a shared cache: exit status" "$rc" 0
case $out in *"$shared_cache: not used as the cache: others can write to it"*) check "klnt says the cache is not used" yes yes ;;
*) check "klnt says the cache is not used ($out)" no yes ;; esac
check "nothing written to a shared cache" "$(ls -A "$shared_cache")" ""

# klnt bench on URLs: every remote row, a series as one set, and the errors a file's have.
out=$("$klnt" bench s3://models/m.klnt --repeat 1 --connections 4) || check "klnt bench s3://: exit" $? 0
rows=$(echo "$out" | awk '$1 == "remote" { print $2 }' | sort | tr '\n' ' ')
check "klnt bench s3://: the rows" "$rows" "curl first-byte load load-1 open "
ratio=$(echo "$out" | awk '$1 == "remote" && $2 == "load" { print $NF }')
case $ratio in [0-9]*.[0-9][0-9]x) check "klnt bench s3://: load's ratio" yes yes ;;
*) check "klnt bench s3://: load's ratio ($ratio)" no yes ;; esac
head=$("$klnt" bench "http://127.0.0.1:$http/series-00001-of-00003.klnt" --repeat 1 | head -n 1)
case $head in "set of 3 urls"*) check "klnt bench a series URL" yes yes ;;
*) check "klnt bench a series URL ($head)" no yes ;; esac
rc=0
# A file's own digest table (klnt gen writes one) read through the URL and every byte checked;
# a copy with a flipped byte is named with its URL and the chunk; a file without one says so.
for u in s3://models/m.klnt "http://127.0.0.1:$http/m.klnt"; do
	out=$("$klnt" verify "$u" 2>&1) || true
	case $out in
	*": ok (1 file, "*"xxh3-128 from embedded)"*) check "klnt verify $u" ok ok ;;
	*) check "klnt verify $u ($out)" no ok ;;
	esac
done
cp "$root/m.klnt" "$root/flip.klnt"
/usr/bin/python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(5 << 20); b = f.read(1); f.seek(5 << 20); f.write(bytes([b[0] ^ 8]))' "$root/flip.klnt"
rc=0
out=$("$klnt" verify "http://127.0.0.1:$http/flip.klnt" 2>&1) || rc=$?
check "klnt verify of a flipped byte: exit status" "$rc" 1
case $out in
*"http://127.0.0.1:$http/flip.klnt: CORRUPT: chunk 5 (bytes 5242880..6291456"*) check "the flipped byte's chunk" yes yes ;;
*) check "the flipped byte's chunk ($out)" no yes ;;
esac
rc=0
out=$("$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf" 2>&1) || rc=$?
check "klnt verify of a URL without digests: exit status" "$rc" 1
# klnt load --verify of a URL: ranged GETs, each part checked against the file's own table as
# it lands (the 25 chunks at least once; a chunk two pieces share is hashed by each)
out=$("$klnt" load --verify s3://models/m.klnt 2>&1) || true
case $out in
*": 300 tensors, "*"every byte checked against its digests as read ("[0-9]*" chunks, "[0-9]*" bytes hashed)"*) check "klnt load --verify s3://" yes yes ;;
*) check "klnt load --verify s3:// ($out)" no yes ;;
esac
rc=0
out=$("$klnt" load --verify "http://127.0.0.1:$http/flip.klnt" 2>&1) || rc=$?
check "klnt load --verify of a flipped byte: exit status" "$rc" 1
case $out in
*"http://127.0.0.1:$http/flip.klnt: CORRUPT: chunk 5 (bytes 5242880..6291456"*) check "klnt load --verify names the URL's chunk" yes yes ;;
*) check "klnt load --verify names the URL's chunk ($out)" no yes ;;
esac

# The other formats' own tables over a URL (klnt export writes them): a safetensors file and a
# GGUF file read with ranged GETs check clean, and with one payload byte flipped name the chunk.
"$klnt" import -o "$work/ms.klnt" --no-sync "$root/m.safetensors" >/dev/null
"$klnt" export --to safetensors -o "$root/e.safetensors" --no-sync "$work/ms.klnt" >/dev/null
"$klnt" import -o "$work/tl.klnt" --no-sync "$root/tiny-llama.gguf" >/dev/null
"$klnt" export --to gguf -o "$root/e.gguf" --no-sync "$work/tl.klnt" >/dev/null
for f in e.safetensors e.gguf; do
	rc=0
	"$klnt" load --verify "http://127.0.0.1:$http/$f" >/dev/null 2>&1 || rc=$?
	check "klnt load --verify of $f over http" "$rc" 0
	size=$(wc -c <"$root/$f")
	cp "$root/$f" "$root/flip-$f"
	printf '\377' | dd of="$root/flip-$f" bs=1 seek=$((size - 10)) conv=notrunc status=none
	rc=0
	out=$("$klnt" load --verify "http://127.0.0.1:$http/flip-$f" 2>&1) || rc=$?
	check "klnt load --verify of flip-$f: exit status" "$rc" 1
	case $out in
	*"http://127.0.0.1:$http/flip-$f: CORRUPT: chunk "*"differs from its digest"*) check "flip-$f: the URL's chunk named" yes yes ;;
	*) check "flip-$f: the URL's chunk named ($out)" no yes ;;
	esac
done

# A sidecar beside a URL (URL.kiln-digest, made with klnt digest on a local copy): fetched with
# the URL's credentials and checked like a local one; none on the server (404) says how to make
# one; a sidecar of another file, or with a flipped digest, is refused.
rc=0
out=$("$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf" 2>&1) || rc=$?
case $out in
*"no table of its own, no .kiln-digest beside it on the server"*) check "a URL without digests says where a sidecar goes" yes yes ;;
*) check "a URL without digests says where a sidecar goes ($out)" no yes ;;
esac
"$klnt" digest "$root/tiny-llama.gguf" >/dev/null
for u in "http://127.0.0.1:$http/tiny-llama.gguf" s3://models/tl.gguf; do
	case $u in s3://*)
		s3 -T "$root/tiny-llama.gguf" "$endpoint/models/tl.gguf" -o /dev/null
		s3 -T "$root/tiny-llama.gguf.kiln-digest" "$endpoint/models/tl.gguf.kiln-digest" -o /dev/null ;;
	esac
	rc=0
	out=$("$klnt" verify "$u" 2>&1) || rc=$?
	case $out in
	*": ok (1 file, "*"xxh3-128 from sidecar"*) check "klnt verify $u against its sidecar on the server" yes yes ;;
	*) check "klnt verify $u against its sidecar on the server ($out)" no yes ;;
	esac
	rc=0
	"$klnt" load --verify "$u" >/dev/null 2>&1 || rc=$?
	check "klnt load --verify $u: parts checked against the server's sidecar" "$rc" 0
done
cp "$root/tiny-llama.gguf" "$root/flip-tl.gguf"
cp "$root/tiny-llama.gguf.kiln-digest" "$root/flip-tl.gguf.kiln-digest"
size=$(wc -c <"$root/flip-tl.gguf")
printf '\377' | dd of="$root/flip-tl.gguf" bs=1 seek=$((size - 3)) conv=notrunc status=none
for cmd in verify "load --verify"; do
	rc=0
	out=$("$klnt" $cmd "http://127.0.0.1:$http/flip-tl.gguf" 2>&1) || rc=$?
	check "klnt $cmd of a flipped byte against the server's sidecar: exit status" "$rc" 1
	case $out in
	*"flip-tl.gguf: CORRUPT: chunk "*"differs from its digest"*) check "klnt $cmd: the chunk named" yes yes ;;
	*) check "klnt $cmd: the chunk named ($out)" no yes ;;
	esac
done
# kiln's cache keeps each version with what the server has beside it (URLHASH-VERSIONHASH.EXT.kiln-digest,
# or none): a check of the cached copy uses it, and catches a byte flipped on the server or in
# the copy.
own_cache="$work/own-cache"
mkdir -p "$own_cache" && chmod 0700 "$own_cache"
sidecars() { ls "$own_cache" | grep -c '\.kiln-digest$' || true; }
versions() { ls "$own_cache" | grep -c '^[0-9a-f]*-[0-9a-f]*\.gguf$' || true; }
for f in tiny-llama.gguf flip-tl.gguf; do
	KILN_CACHE_DIR="$own_cache" "$klnt" check "http://127.0.0.1:$http/$f" >/dev/null 2>&1 || true
done
check "the cache keeps the sidecar of each of two URLs" "$(sidecars)" 2
verdict "klnt verify from the cache against the kept sidecar" 0 "*: ok (1 file, *xxh3-128 from sidecar*" \
	env KILN_CACHE_DIR="$own_cache" "$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf"
# Opened without asking the server (within its max age), through the URL's link that names no
# version: the version is the entry that is the same file, and its sidecar is used.
verdict "a fresh cached copy is checked against its version's sidecar" 0 "*: ok (1 file, *xxh3-128 from sidecar*" \
	env KILN_CACHE_DIR="$own_cache" KILN_CACHE_MAX_AGE_MS=600000 "$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf"
# The same through a cache directory named by a symbolic link (the cache follows it).
ln -s "$own_cache" "$work/own-cache-link"
verdict "a fresh cached copy through a linked cache directory is checked" 0 "*: ok (1 file, *xxh3-128 from sidecar*" \
	env KILN_CACHE_DIR="$work/own-cache-link" KILN_CACHE_MAX_AGE_MS=600000 "$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf"
rm -f "$work/own-cache-link"
for cmd in verify "load --verify"; do
	verdict "klnt $cmd from the cache: the chunk named" 1 "*flip-tl.gguf: CORRUPT: chunk *differs from its digest*" \
		env KILN_CACHE_DIR="$own_cache" "$klnt" $cmd "http://127.0.0.1:$http/flip-tl.gguf"
done
# The cached versions by what they hold.
entry_of() {
	for e in $(ls "$own_cache"); do
		case $e in *-*.gguf) if cmp -s "$own_cache/$e" "$1"; then echo "$e"; fi ;; esac
	done
}
tl_entry=$(entry_of "$root/tiny-llama.gguf")
flip_entry=$(entry_of "$root/flip-tl.gguf")
# A byte flipped in the cached copy itself (the disk under the cache).
size=$(wc -c <"$own_cache/$tl_entry")
printf '\377' | dd of="$own_cache/$tl_entry" bs=1 seek=$((size - 5)) conv=notrunc status=none
verdict "a byte flipped in the cached copy is caught" 1 "*tiny-llama.gguf: CORRUPT: chunk *differs from its digest*" \
	env KILN_CACHE_DIR="$own_cache" "$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf"
# The same, opened without asking the server: the flipped bytes are caught through the fresh
# copy's version too (the server's in flip-tl, the cache's own in tiny-llama). Decoys of the
# same URL, copies with other version names and sidecars that are no table, are not taken for
# its version: that is the entry that is the same file, not any of the same URL.
for v in 0 1 2 3 4 5 6 7; do
	decoy=${tl_entry%%-*}-fffffffffffffff$v.gguf
	cp "$own_cache/$tl_entry" "$own_cache/$decoy"
	echo "not a digest table" >"$own_cache/$decoy.kiln-digest"
done
# A symbolic link to the URL's link is not the same file either (never followed).
ln -s "${tl_entry%%-*}.gguf" "$own_cache/${tl_entry%%-*}-fffffffffffffff8.gguf"
echo "not a digest table" >"$own_cache/${tl_entry%%-*}-fffffffffffffff8.gguf.kiln-digest"
for f in flip-tl.gguf tiny-llama.gguf; do
	verdict "a flipped byte in the fresh cached $f is caught" 1 "*$f: CORRUPT: chunk *differs from its digest*" \
		env KILN_CACHE_DIR="$own_cache" KILN_CACHE_MAX_AGE_MS=600000 "$klnt" verify "http://127.0.0.1:$http/$f"
done
rm -f "$own_cache/${tl_entry%%-*}-fffffffffffffff"*
# A new version on the server replaces the old one and its sidecar; one the server has no
# sidecar for is kept without, and says so.
rm -f "$root/flip-tl.gguf.kiln-digest"
printf '\376' | dd of="$root/flip-tl.gguf" bs=1 seek=$((size - 3)) conv=notrunc status=none
touch -d '+1 hour' "$root/flip-tl.gguf"
KILN_CACHE_DIR="$own_cache" "$klnt" check "http://127.0.0.1:$http/flip-tl.gguf" >/dev/null 2>&1 || true
verdict "a new version without a sidecar says so" 1 "*kiln's cache keeps no .kiln-digest for this version*" \
	env KILN_CACHE_DIR="$own_cache" "$klnt" verify "http://127.0.0.1:$http/flip-tl.gguf"
verdict "the new version without a sidecar, fresh, says so" 1 "*kiln's cache keeps no .kiln-digest for this version*" \
	env KILN_CACHE_DIR="$own_cache" KILN_CACHE_MAX_AGE_MS=600000 "$klnt" verify "http://127.0.0.1:$http/flip-tl.gguf"
check "the old version went with its sidecar" "$(ls "$own_cache" | grep -c "^$flip_entry" || true)" 0
check "one sidecar left, the other URL's" "$(sidecars)" 1
# A sidecar the server fails to give (a socket in nginx's root: 500) keeps the version out of
# the cache: the next open asks again.
cp "$root/tiny-llama.gguf" "$root/sock.gguf"
/usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$root/sock.gguf.kiln-digest"
n=$(versions)
KILN_CACHE_DIR="$own_cache" "$klnt" check "http://127.0.0.1:$http/sock.gguf" >/dev/null 2>&1 || true
check "a sidecar the server failed to give: the version not kept" "$(versions)" "$n"
rm -f "$root/sock.gguf" "$root/sock.gguf.kiln-digest"
# Sidecars left without their version (a crash between the two): removed by the next store
# once older than a minute, a young one left (its version may be on its way).
old_orphan=0123456789abcdef0123456789abcdef-0123456789abcdef.gguf.kiln-digest
young_orphan=0123456789abcdef0123456789abcdef-fedcba9876543210.gguf.kiln-digest
: >"$own_cache/$old_orphan"
: >"$own_cache/$young_orphan"
touch -d '-2 hours' "$own_cache/$old_orphan"
KILN_CACHE_DIR="$own_cache" "$klnt" check "http://127.0.0.1:$http/e.safetensors" >/dev/null 2>&1 || true
check "an old orphaned sidecar is removed" "$(ls "$own_cache" | grep -c "^$old_orphan$" || true)" 0
check "a young one is left" "$(ls "$own_cache" | grep -c "^$young_orphan$" || true)" 1
rm -f "$own_cache/$young_orphan"
# Versions evicted for room (to store e.gguf) take their sidecars with them.
KILN_CACHE_DIR="$own_cache" KILN_CACHE_MAX_BYTES=100000 "$klnt" check "http://127.0.0.1:$http/e.gguf" >/dev/null 2>&1 || true
check "evicted versions took their sidecars" "$(sidecars)" 0
check "one version is left" "$(versions)" 1
# A symbolic link in the sidecar's place is not followed.
KILN_CACHE_DIR="$own_cache" "$klnt" check "http://127.0.0.1:$http/tiny-llama.gguf" >/dev/null 2>&1 || true
tl_entry=$(entry_of "$root/tiny-llama.gguf")
check "the sidecar kept again" "$(sidecars)" 1
mv "$own_cache/$tl_entry.kiln-digest" "$work/kept.kiln-digest"
ln -s "$work/kept.kiln-digest" "$own_cache/$tl_entry.kiln-digest"
verdict "a symlink as the cached sidecar is refused" 3 "*a symbolic link, not followed*" \
	env KILN_CACHE_DIR="$own_cache" "$klnt" verify "http://127.0.0.1:$http/tiny-llama.gguf"
# A version evicted after its copy was opened takes its sidecar along: a check made then says
# so, for a fresh copy (opened through the URL's link) and for one the server confirmed (opened
# as its version's entry), not that the server gave none. One process each: the Python module,
# where it is built without ASan, as above.
rm -f "$own_cache/$tl_entry.kiln-digest"
mv "$work/kept.kiln-digest" "$own_cache/$tl_entry.kiln-digest"
cat >"$work/evict.py" <<'EOF'
import filecmp
import os
import sys

import kiln

url, cache, original = sys.argv[1:4]
with kiln.open(url):  # the version kept, with its sidecar (fetched if it was not)
    pass
m = kiln.open(url)
entry = [os.path.join(cache, e) for e in os.listdir(cache)
         if e.endswith(".gguf") and "-" in e
         and filecmp.cmp(os.path.join(cache, e), original, shallow=False)]
for evicted in (False, True):
    if evicted:
        os.unlink(entry[0])
        os.unlink(entry[0] + ".kiln-digest")
    try:
        m.verify_digests()
        print("verified")
    except kiln.Error as e:
        print(e.cls, e)
EOF
evicted_after_open() {
	what=$1
	shift
	out=$(env "$@" KILN_CACHE_DIR="$own_cache" PYTHONPATH="$py" /usr/bin/python3 "$work/evict.py" \
		"http://127.0.0.1:$http/tiny-llama.gguf" "$own_cache" "$root/tiny-llama.gguf" 2>&1)
	case $out in
	*"verified"*"NOTFOUND"*"left kiln's cache after it was opened"*) check "$what" yes yes ;;
	*) check "$what ($out)" no yes ;;
	esac
}
if [ -d "$py/kiln" ] && ! nm -D "$py"/kiln/_kiln*.so 2>/dev/null | grep -q __asan_init; then
	evicted_after_open "a version evicted after a fresh copy was opened: said so" \
		KILN_CACHE_MAX_AGE_MS=600000
	evicted_after_open "a version evicted after a confirmed copy was opened: said so"
fi
cp "$root/tiny-llama.gguf.kiln-digest" "$root/e.gguf.kiln-digest"
rc=0
out=$("$klnt" verify "http://127.0.0.1:$http/e.gguf" 2>&1) || rc=$?
check "a sidecar of another file beside a URL: exit status" "$rc" 1
case $out in
*": TYPE: http://127.0.0.1:$http/e.gguf.kiln-digest: digest table: "*"the digests of another file"*) check "a sidecar of another file beside a URL is named" yes yes ;;
*) check "a sidecar of another file beside a URL is named ($out)" no yes ;;
esac
rm -f "$root/e.gguf.kiln-digest"
rc=0
out=$("$klnt" digest "http://127.0.0.1:$http/e.gguf" 2>&1) || rc=$?
case $out in
*"kiln writes no sidecar to a server"*) check "klnt digest URL says to digest a local copy" yes yes ;;
*) check "klnt digest URL says to digest a local copy ($out)" no yes ;;
esac

AWS_SECRET_ACCESS_KEY=wrong "$klnt" bench s3://models/m.klnt -r 1 >/dev/null 2>&1 || rc=$?
check "klnt bench with a wrong secret: exit status" "$rc" 3
rc=0
"$klnt" bench s3://models/m.klnt --cold >/dev/null 2>&1 || rc=$?
check "klnt bench --cold on a URL: usage" "$rc" 2
exit $fail
