#!/bin/sh
# Run the libFuzzer targets one after another, each for SECONDS, starting from a copy of the
# committed corpus (fuzz/corpus/<target>/) so the tree is not modified. Exits non-zero on the
# first crash, leak or timeout and leaves the reproducer under WORK/<target>-crash-* (WORK is
# printed). Set KILN_FUZZ_WORK to keep the working corpus (WORK/<target>/) after a clean run;
# to keep what adds coverage, merge it into the committed corpus:
#   build-fuzz/fuzz/fuzz_parse -merge=1 -use_counters=0 fuzz/corpus/parse WORK/parse
#
# usage: fuzz/run.sh BUILD_DIR SECONDS [TARGET...]   (targets: parse roundtrip lookup safetensors gguf http
#   s3error awsconfig index cache digest signing)
# Build first: CC=clang cmake -S . -B build-fuzz -DKILN_FUZZ=ON && cmake --build build-fuzz
set -eu
build=$1
seconds=$2
shift 2
targets=${*:-parse roundtrip lookup safetensors gguf http s3error awsconfig index cache digest signing}
src=$(cd "$(dirname "$0")" && pwd)
work=${KILN_FUZZ_WORK:-}
if [ -z "$work" ]; then
	work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz.XXXXXX")
	cleanup=1 # a scratch directory of our own: removed when every target passes
fi
echo "fuzz: working corpus and logs in $work"
for t in $targets; do
	mkdir -p "$work/$t"
	cp "$src/corpus/$t"/* "$work/$t/"
	dict="$src/klnt.dict" # a target's own dictionary when it has one (fuzz/<target>.dict)
	[ -f "$src/$t.dict" ] && dict="$src/$t.dict"
	echo "fuzz: $t for $seconds s"
	if ! "$build/fuzz/fuzz_$t" "$work/$t" -max_total_time="$seconds" -timeout=10 \
		-rss_limit_mb=2048 -dict="$dict" -artifact_prefix="$work/$t-" \
		-print_final_stats=1 >"$work/$t.log" 2>&1; then
		tail -n 60 "$work/$t.log"
		echo "fuzz: $t failed; reproducer: $(ls "$work/$t"-* 2>/dev/null | head -n 1)" >&2
		exit 1
	fi
	grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb)' \
		"$work/$t.log" | sed "s/^/fuzz: $t: /"
done
[ "${cleanup:-0}" = 1 ] && rm -rf "$work"
exit 0
