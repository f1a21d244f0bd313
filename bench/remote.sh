#!/bin/sh
# Loads from object storage on 127.0.0.1 (Ceph's S3 gateway, tests/servers/rgw.sh), side by
# side, round after round in rotating order, medians at the end (docs/benchmarks.md, "Object
# storage"):
#   full load   kiln_model_open of s3://... (every payload byte into memory) against one curl GET
#               of the object to /dev/null and boto3's download_fileobj (s3transfer, threads) to a
#               sink that drops the bytes; each time covers the transfer alone, not the process;
#   open        KILN_OPEN_DIRECTORY_ONLY against one HEAD request;
#   cache       the second open of the URL through KILN_CACHE_DIR (confirmed with one GET, and
#               within its max age with none) against opening the cached file by its path, in
#               a new process each, and alternating in one process (remote_load map-pair);
#   klnt bench  the same object through `klnt bench URL`: its rows, the same rounds.
#
#   bench/remote.sh BUILD_DIR [SIZE_MIB [ROUNDS]]      (defaults: 1024 MiB, 5 rounds)
set -eu
build=$(cd "$1" && pwd)
size=${2:-1024}
rounds=${3:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-remote-bench.XXXXXX")
trap '"$here/tests/servers/rgw.sh" stop "$work/rgw"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

"$build/klnt" gen "$work/m.klnt" --tensors 300 --bytes "${size}M" --no-sync >/dev/null
. "$here/tests/servers/common.sh"
start_server "$here/tests/servers/rgw.sh" start "$work/rgw" # endpoint= access= secret=
s3() {
	curl -sf --aws-sigv4 aws:amz:us-east-1:s3 -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
		--user "$access:$secret" "$@"
}
s3 -X PUT "$endpoint/bench" -o /dev/null
s3 -T "$work/m.klnt" "$endpoint/bench/m.klnt" -o /dev/null
rm -f "$work/m.klnt" # the page cache and the disk hold nothing of it: the gateway has it
export AWS_ACCESS_KEY_ID="$access" AWS_SECRET_ACCESS_KEY="$secret" AWS_ENDPOINT_URL="$endpoint"
url=s3://bench/m.klnt

cat >"$work/boto.py" <<'EOF'
import os, sys, time
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}))
class Sink:
    def write(self, b):
        return len(b)
t = time.perf_counter()
s3.download_fileobj("bench", "m.klnt", Sink())
print("%.6f" % (time.perf_counter() - t))
EOF

kiln_load() { "$build/bench/remote_load" load "$url"; }
curl_get() { s3 -o /dev/null -w '%{time_total}\n' "$endpoint/bench/m.klnt"; }
boto() { /usr/bin/python3 "$work/boto.py"; }
kiln_open() { "$build/bench/remote_load" open "$url"; }
head_req() { s3 -I -o /dev/null -w '%{time_total}\n' "$endpoint/bench/m.klnt"; }

: >"$work/times"
for r in $(seq 1 "$rounds"); do
	case $((r % 3)) in
	0) order="kiln_load curl_get boto" ;;
	1) order="curl_get boto kiln_load" ;;
	2) order="boto kiln_load curl_get" ;;
	esac
	for what in $order; do
		echo "$what $($what)" >>"$work/times"
	done
	for i in 1 2 3 4 5; do
		echo "kiln_open $(kiln_open)" >>"$work/times"
		echo "head_req $(head_req)" >>"$work/times"
	done
done

# The cache: fill it, then the second opens beside the cached file's own.
cache=$work/cache
KILN_CACHE_DIR=$cache "$build/bench/remote_load" map "$url" >/dev/null
cached=$(ls "$cache"/*-*.klnt) # the version, not the link to it
for r in $(seq 1 $((rounds * 4))); do
	echo "cache_confirmed $(KILN_CACHE_DIR=$cache "$build/bench/remote_load" map "$url")" \
		>>"$work/times"
	echo "cache_fresh $(KILN_CACHE_DIR=$cache KILN_CACHE_MAX_AGE_MS=600000 \
		"$build/bench/remote_load" map "$url")" >>"$work/times"
	echo "cached_file $("$build/bench/remote_load" map "$cached")" >>"$work/times"
done
# In one process, alternating: fresh hit, cached file, 100 rounds (medians and the ratio's).
pair=$(KILN_CACHE_DIR=$cache KILN_CACHE_MAX_AGE_MS=600000 "$build/bench/remote_load" map-pair \
	"$url" "$cached")

/usr/bin/python3 - "$work/times" "$size" "$pair" <<'EOF'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    t.setdefault(k, []).append(float(v))
mib = int(sys.argv[2])
med = {k: statistics.median(v) for k, v in t.items()}
gbs = lambda s: mib * 1048576 / s / 1e9
print("full load of a %d MiB object, %d rounds (median seconds, GB/s):" % (mib, len(t["kiln_load"])))
for k in ("kiln_load", "curl_get", "boto"):
    print("  %-10s %8.3f s  %6.2f GB/s" % (k, med[k], gbs(med[k])))
best = min(med["curl_get"], med["boto"])
print("  kiln vs the best of curl and boto3: %.2fx (their time over kiln's)" % (best / med["kiln_load"]))
print("open (directory only) %.2f ms, one HEAD %.2f ms: %.2fx a HEAD"
      % (med["kiln_open"] * 1e3, med["head_req"] * 1e3, med["kiln_open"] / med["head_req"]))
print("cache: confirmed %.3f ms, fresh %.3f ms, the cached file %.3f ms: fresh %.2fx, confirmed %.2fx"
      % (med["cache_confirmed"] * 1e3, med["cache_fresh"] * 1e3, med["cached_file"] * 1e3,
         med["cache_fresh"] / med["cached_file"], med["cache_confirmed"] / med["cached_file"]))
fresh, local, ratio = (float(x) for x in sys.argv[3].split())
print("cache, one process alternating 100 rounds: fresh %.1f us, the cached file %.1f us, "
      "median ratio %.3fx" % (fresh * 1e6, local * 1e6, ratio))
EOF

"$build/klnt" bench "$url" --repeat "$rounds"
