#!/bin/sh
# Plot full-load throughput per source, cold and warm, against the baselines, from the JSON that
# bench_load writes (--benchmark_out=FILE --benchmark_out_format=json).
#
#   bench/plot.sh load.json [out.png]      (default out: docs/benchmarks.png)
#
# Bars: median GB/s over the repetitions, whiskers min-max. Lines: the baselines of the same run
# (memcpy into a reused buffer and into fresh THP memory; plain read() cold and warm). Log scale,
# since zero-copy mmap rows only build page tables. Needs jq and gnuplot (gnuplot-nox is enough);
# the build and the tests do not.
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 load.json [out.png]" >&2
	exit 2
fi
for tool in jq gnuplot; do
	command -v $tool >/dev/null || { echo "$0: needs $tool" >&2; exit 1; }
done
json=$1
out=${2:-$(dirname "$0")/../docs/benchmarks.png}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck disable=SC2016 # jq programs, not shell expansions
defs='
def short: sub("/iterations:[0-9]+/repeats:[0-9]+/real_time$"; "");
def agg($n): [.benchmarks[] | select(.aggregate_name == $n)]
	| map({key: (.run_name | short), value: .["GB/s"]}) | from_entries;
def uniq: reduce .[] as $x ([]; if any(.[]; . == $x) then . else . + [$x] end);
'
# One row per source: name, cold median/min/max, warm median/min/max ("NaN" when missing).
jq -r "$defs"'
agg("median") as $m | agg("min") as $lo | agg("max") as $hi
| [.benchmarks[] | .run_name | short | select(test("^load/(cold|warm)/[a-z_]+$"))
   | sub("^load/(cold|warm)/"; "")] | uniq[]
| . as $s | ("load/cold/" + $s) as $c | ("load/warm/" + $s) as $w
| [$s, $m[$c], $lo[$c], $hi[$c], $m[$w], $lo[$w], $hi[$w]]
| map(if . == null then "NaN" else tostring end) | join("\t")
' "$json" >"$tmp/data.tsv"

base() {
	jq -r "$defs"'agg("median")["'"$1"'"] // "NaN"' "$json"
}
memcpy=$(base base/warm/memcpy_reused)
fresh=$(base base/warm/memcpy_fresh_thp)
rcold=$(base base/cold/read_4MiB)
rwarm=$(base base/warm/read_4MiB)
when=$(jq -r '.context.date' "$json")

cat >"$tmp/plot.gp" <<EOF
set terminal pngcairo size 1280,720 font "sans,11"
set output "$out"
set title "kiln: full load of a 1 GiB, 300-tensor file (median of repetitions, whiskers min-max)\n{/*0.8 $when; baselines from the same run; mmap rows are zero-copy (page tables only, no bytes moved)}"
set ylabel "GB/s (10^9 bytes/s, log scale)"
set logscale y
set yrange [0.1:1000]
set grid ytics mytics lc rgb "#dddddd"
set style data histogram
set style histogram errorbars gap 2 lw 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set xtics rotate by -30 noenhanced
set datafile separator "\t"
set datafile missing "NaN"
c_cold = "#3b75af"
c_warm = "#ef8636"
set key top right box opaque
set rmargin 8
set bmargin 8
plot "$tmp/data.tsv" using 2:3:4:xtic(1) title "cold (page cache evicted)" lc rgb c_cold, \
     "" using 5:6:7 title "warm (file in page cache)" lc rgb c_warm, \
     $memcpy with lines lw 2 lc rgb "#2ca02c" dt 1 title sprintf("memcpy into a reused buffer: %.1f", $memcpy), \
     $fresh with lines lw 2 lc rgb "#2ca02c" dt 2 title sprintf("memcpy into fresh THP memory: %.1f", $fresh), \
     $rwarm with lines lw 2 lc rgb c_warm dt 3 title sprintf("plain read(), 4 MiB buffer, warm: %.1f", $rwarm), \
     $rcold with lines lw 2 lc rgb c_cold dt 3 title sprintf("plain read(), 4 MiB buffer, cold: %.1f", $rcold)
EOF
gnuplot "$tmp/plot.gp"
echo "wrote $out"
