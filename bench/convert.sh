#!/bin/bash
# SPDX-License-Identifier: MIT
#
# klnt import and export of a 1 GiB model against cp of the same file, in one run:
#
#   bench/convert.sh KLNT WORK_DIR [ROUNDS] [TENSORS]
#
# KLNT is the klnt binary (build/klnt); WORK_DIR a directory on the disk to measure, which gets
# at most two 1 GiB inputs at a time plus one output, all removed at the end. ROUNDS (default 7)
# rounds run every command once each, in an order rotated every round, so a slow period of the
# machine hits every row; a round before them warms the page cache and is not counted.
#
# The model: two tensors of random bytes, f16 [16384, 16384] and f32 [8192, 16384] (512 MiB
# each), written with `klnt pack`; the GGUF and safetensors files come from `klnt export`. With
# TENSORS, a tensor-heavy model instead: that many f16 [128, 1024] tensors (256 KiB each, one
# block of random bytes repeated; 4096 make 1 GiB).
# Every source is read once before the rounds and stays in the page cache (the machine needs a
# few GiB free). Each command writes a new output, which is removed after it, followed by an
# untimed `sync` so that one command's write-back does not land in the next one's time.
#
# Two comparisons, each on the same work:
#   --no-sync against `cp SRC OUT`:            the data lands in the page cache, nothing waits
#                                              for the disk;
#   default (fsync'ed) against `cp SRC OUT && sync OUT` (sync(1) with a file: fsync of it).
# Prints, per command, the median wall-clock time with [min-max] over the rounds and the ratio
# of speeds (the baseline's median time over the command's: 1.00 is as fast, above is faster).
#
# KLNT_BEFORE=OTHER_KLNT adds export rows run with another build (say, the commit before a
# change), in the same rounds.
set -u
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
	echo "usage: $0 KLNT WORK_DIR [ROUNDS] [TENSORS]" >&2
	exit 2
fi
KLNT=$1 W=$2 ROUNDS=${3:-7} TENSORS=${4:-}
mkdir -p "$W" || exit 1
cleanup() { rm -f "$W"/a.raw "$W"/b.raw "$W"/m.klnt "$W"/m.gguf "$W"/m.safetensors "$W"/out*; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "making the model in $W ..." >&2
if [ -n "$TENSORS" ]; then
	head -c 262144 /dev/urandom >"$W/a.raw" || exit 1
	args=()
	for ((i = 0; i < TENSORS; i++)); do
		args+=(--tensor "blk.$i.weight:f16:128,1024:$W/a.raw")
	done
	"$KLNT" pack --no-sync "$W/m.klnt" "${args[@]}" >/dev/null || exit 1
else
	head -c 536870912 /dev/urandom >"$W/a.raw" && head -c 536870912 /dev/urandom >"$W/b.raw" &&
		"$KLNT" pack --no-sync "$W/m.klnt" --tensor "tok_embd.weight:f16:16384,16384:$W/a.raw" \
			--tensor "output.weight:f32:8192,16384:$W/b.raw" >/dev/null || exit 1
fi
rm -f "$W/a.raw" "$W/b.raw"

# run NAME...: the rows of one phase, named "label|command" (the command sees $W; OUT is its
# output). Prints the table rows; times in seconds.
declare -A T
run_phase() {
	local rows=("$@") n=$# r i k label cmd t0 t1
	for ((r = 0; r <= ROUNDS; r++)); do
		for ((i = 0; i < n; i++)); do
			k=$(((i + r) % n))
			label=${rows[k]%%|*} cmd=${rows[k]#*|}
			rm -f "$W"/out*
			sync
			t0=$EPOCHREALTIME
			eval "$cmd" >/dev/null || {
				echo "failed: $cmd" >&2
				exit 1
			}
			t1=$EPOCHREALTIME
			[ "$r" -gt 0 ] && T[$label]="${T[$label]:-} $(echo "$t1 - $t0" | bc)"
		done
	done
	rm -f "$W"/out*
	sync
}

# median, min, max of the times of a label: "MED MIN MAX"
stats() {
	# shellcheck disable=SC2086 # one time per word
	printf '%s\n' ${T[$1]} | sort -n | awk '{ v[NR] = $1 } END {
		m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'
}

row() { # LABEL BASELINE_LABEL
	local s b
	s=$(stats "$1") b=$(stats "$2")
	# shellcheck disable=SC2086 # the three numbers of $s are three words
	set -- "$1" "$2" $s ${b%% *}
	awk -v l="$1" -v m="$3" -v lo="$4" -v hi="$5" -v base="$6" -v bl="$2" 'BEGIN {
		printf "| %s | %.2f s [%.2f-%.2f] | %.2f (vs %s) |\n", l, m, lo, hi, base / m, bl }'
}

phase() { # FORMAT SRC(in $W)
	local f=$1 src=$2 to=$1
	cat "$W/m.klnt" "$W/$src" >/dev/null
	T=()
	local rows=(
		"cp $src out|cp \"\$W/$src\" \"\$W/out\""
		"cp $src out && sync out|cp \"\$W/$src\" \"\$W/out\" && sync \"\$W/out\""
		"import --no-sync $f|\"\$KLNT\" import --no-sync -o \"\$W/out.klnt\" \"\$W/$src\""
		"import $f|\"\$KLNT\" import -o \"\$W/out.klnt\" \"\$W/$src\""
		"export --no-sync --to $to|\"\$KLNT\" export --no-sync --to $to -o \"\$W/out\" \"\$W/m.klnt\""
		"export --to $to|\"\$KLNT\" export --to $to -o \"\$W/out\" \"\$W/m.klnt\"")
	[ -n "${KLNT_BEFORE:-}" ] && rows+=(
		"before: export --no-sync --to $to|\"\$KLNT_BEFORE\" export --no-sync --to $to -o \"\$W/out\" \"\$W/m.klnt\""
		"before: export --to $to|\"\$KLNT_BEFORE\" export --to $to -o \"\$W/out\" \"\$W/m.klnt\"")
	run_phase "${rows[@]}"
	echo
	echo "$f ($(stat -c %s "$W/$src") bytes${TENSORS:+, $TENSORS tensors}), $ROUNDS rounds: median [min-max], speed ratio"
	echo
	echo "| command | time | vs baseline |"
	echo "|---|---|---|"
	row "cp $src out" "cp $src out"
	row "import --no-sync $f" "cp $src out"
	row "export --no-sync --to $to" "cp $src out"
	[ -n "${KLNT_BEFORE:-}" ] && row "before: export --no-sync --to $to" "cp $src out"
	row "cp $src out && sync out" "cp $src out && sync out"
	row "import $f" "cp $src out && sync out"
	row "export --to $to" "cp $src out && sync out"
	[ -n "${KLNT_BEFORE:-}" ] && row "before: export --to $to" "cp $src out && sync out"
	return 0
}

"$KLNT" export --no-sync --to gguf -o "$W/m.gguf" "$W/m.klnt" >/dev/null || exit 1
phase gguf m.gguf
rm -f "$W/m.gguf"
"$KLNT" export --no-sync --to safetensors -o "$W/m.safetensors" "$W/m.klnt" >/dev/null || exit 1
phase safetensors m.safetensors
echo
echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)," \
	"$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1); $W on" \
	"$(df -T "$W" | awk 'NR == 2 { print $2, $1 }'); kernel $(uname -r)"
