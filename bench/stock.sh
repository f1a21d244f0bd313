#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Loads of stock files against the same loads of their KLNT imports (the target: within 5 %,
# every source):
#
#   bench/stock.sh KLNT WORK_DIR [RUNS] [TENSORS]
#
# KLNT is the klnt binary (build/klnt); WORK_DIR a directory on the disk to measure. The model:
# TENSORS (default 3000) f16 tensors [128, 1024] (256 KiB each, 750 MiB for 3000) of random
# bytes, packed as KLNT, exported to GGUF and safetensors, and each export imported back to
# KLNT: the pairs compared hold the same tensors, the stock file as its writer laid it out, the
# import aligned. Every file is dropped from the page cache and read back once with cat before
# its runs, so both files of a pair are cached alike (warm loads; the machine needs a few GiB
# free); all are removed at the end.
#
# RUNS (default 5) runs alternate `klnt bench --warm` of the stock file and of its import, each
# run 3 rounds of every source; per source, the run's median time. Prints per format and
# source the median over the runs of both files' times and of the per-run ratio of the import's
# time over the stock file's (1.00: as fast; 0.95: the stock load 5 % slower).
set -u
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
	echo "usage: $0 KLNT WORK_DIR [RUNS] [TENSORS]" >&2
	exit 2
fi
KLNT=$1 W=$2 RUNS=${3:-5} N=${4:-3000}
SOURCES=(open mmap populate read uring read-direct stream)
mkdir -p "$W" || exit 1
cleanup() { rm -f "$W"/s.raw "$W"/m.klnt "$W"/m.gguf "$W"/m.safetensors "$W"/m-*.klnt; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "making $N tensors in $W ..." >&2
head -c 262144 /dev/urandom >"$W/s.raw" || exit 1
args=()
for ((i = 0; i < N; i++)); do
	args+=(--tensor "blk.$i.weight:f16:128,1024:$W/s.raw")
done
"$KLNT" pack --no-sync "$W/m.klnt" "${args[@]}" >/dev/null || exit 1
rm -f "$W/s.raw"
for f in gguf safetensors; do
	"$KLNT" export --no-sync --to $f -o "$W/m.$f" "$W/m.klnt" >/dev/null &&
		"$KLNT" import --no-sync -o "$W/m-$f.klnt" "$W/m.$f" >/dev/null || exit 1
done
rm -f "$W/m.klnt"
# Written back, so that dropping them from the page cache below drops every page.
sync "$W"/m.gguf "$W"/m-gguf.klnt "$W"/m.safetensors "$W"/m-safetensors.klnt || exit 1

# One run of klnt bench: "SOURCE MEDIAN_MS" lines.
bench() {
	local a=()
	for s in "${SOURCES[@]}"; do a+=(-s "$s"); done
	"$KLNT" bench --warm -r 3 "${a[@]}" "$1" 2>/dev/null |
		awk '$1 == "warm" && $3 ~ /^[0-9.]+$/ { print $2, $3 }'
}

declare -A T
for f in gguf safetensors; do
	# Both files into the page cache the same way (dropped, then read through once): how a
	# file was written decides the page cache's folio sizes, which alone moved plain read()
	# by up to 30 % between two files of the same size.
	for x in "$W/m.$f" "$W/m-$f.klnt"; do
		dd if="$x" iflag=nocache count=0 status=none && cat "$x" >/dev/null || exit 1
	done
	for ((r = 0; r < RUNS; r++)); do
		echo "$f: run $((r + 1)) of $RUNS" >&2
		while read -r s ms; do T[$f,stock,$s]="${T[$f,stock,$s]:-} $ms"; done < <(bench "$W/m.$f")
		while read -r s ms; do T[$f,klnt,$s]="${T[$f,klnt,$s]:-} $ms"; done < <(bench "$W/m-$f.klnt")
	done
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
	printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo
echo "$N tensors, $RUNS alternating runs of 3 rounds each; medians over the runs (ms)"
echo
echo "| format | source | stock | its KLNT import | import time / stock time |"
echo "|---|---|---|---|---|"
for f in gguf safetensors; do
	for s in "${SOURCES[@]}" plain; do
		# shellcheck disable=SC2206 # one time per word
		a=(${T[$f,stock,$s]:-}) b=(${T[$f,klnt,$s]:-})
		if [ ${#a[@]} -ne "$RUNS" ] || [ ${#b[@]} -ne "$RUNS" ]; then continue; fi
		ratios=()
		for ((r = 0; r < RUNS; r++)); do
			ratios+=("$(awk -v x="${a[r]}" -v y="${b[r]}" 'BEGIN { printf "%.4f", (x > 0) ? y / x : 0 }')")
		done
		printf '| %s | %s | %s | %s | %.2f |\n' "$f" "$s" "$(median "${a[@]}")" \
			"$(median "${b[@]}")" "$(median "${ratios[@]}")"
	done
done
echo
echo "sizes: $(stat -c '%n %s' "$W"/m.gguf "$W"/m-gguf.klnt "$W"/m.safetensors "$W"/m-safetensors.klnt | sed "s|$W/||g" | paste -sd ' ')"
echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)," \
	"$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1); kernel $(uname -r)"
