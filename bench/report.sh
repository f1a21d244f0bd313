#!/bin/sh
# Markdown tables from Google Benchmark JSON written by bench_load and bench_open
# (--benchmark_out=FILE --benchmark_out_format=json), as pasted into docs/benchmarks.md.
#
#   bench/report.sh load.json [open.json]
#
# Load rows: the median over repetitions with [min-max], and the median of each ratio counter.
# Open rows: the median with [min-max] over the repetition rows in the file (run bench_open with
# --benchmark_repetitions=N and without --benchmark_report_aggregates_only). Needs jq.
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 load.json [open.json]" >&2
	exit 2
fi
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 1; }
load=$1
open=${2:-}

# Helpers shared by every query: short names and per-aggregate lookups.
# shellcheck disable=SC2016 # jq programs, not shell expansions
defs='
def short: sub("/iterations:[0-9]+/repeats:[0-9]+/real_time$"; "") | sub("/real_time$"; "");
def agg($n): [.benchmarks[] | select(.aggregate_name == $n)]
	| map({key: (.run_name | short), value: .}) | from_entries;
def f($d): if . == null then "-"
	else (. * pow(10; $d) | round | tostring) as $s
	| ([$d + 1 - ($s | length), 0] | max) as $pad
	| (if $pad > 0 then "0" * $pad else "" end) + $s
	| if $d > 0 then .[:-$d] + "." + .[-$d:] else . end end;
def uniq: reduce .[] as $x ([]; if any(.[]; . == $x) then . else . + [$x] end);
def gbs($m; $lo; $hi; $k): if $m[$k] == null then "-"
	else "\($m[$k]["GB/s"] | f(2)) [\($lo[$k]["GB/s"] | f(2))-\($hi[$k]["GB/s"] | f(2))]" end;
def ms($m; $lo; $hi; $k): if $m[$k] == null then "-"
	else "\($m[$k].real_time / 1e6 | f(2)) [\($lo[$k].real_time / 1e6 | f(2))-\($hi[$k].real_time / 1e6 | f(2))]" end;
def ctr($m; $k; $c): if $m[$k] == null then "-" else ($m[$k][$c] | f(2)) end;
'

echo "Baselines (GB/s = 10^9 bytes/s; median [min-max] of the repetitions):"
echo
jq -r "$defs"'
agg("median") as $m | agg("min") as $lo | agg("max") as $hi
| "| baseline | GB/s | time per iteration (ms) | x_memcpy | destination |",
  "|---|---|---|---|---|",
  ($m | keys_unsorted[] | select(startswith("base/")) as $k
   | "| `\($k | ltrimstr("base/"))` | \(gbs($m; $lo; $hi; $k)) | \(ms($m; $lo; $hi; $k)) | \(ctr($m; $k; "x_memcpy")) | \($m[$k].label | ltrimstr("dst: ")) |")
' "$load"

echo
echo "Cold open (page cache evicted before every iteration; ms, median [min-max]):"
echo
jq -r "$defs"'
agg("median") as $m | agg("min") as $lo | agg("max") as $hi
| "| row | time (ms) | page cache after (KiB) |",
  "|---|---|---|",
  ($m | keys_unsorted[] | select(startswith("cold_open/")) as $k
   | "| `\($k | ltrimstr("cold_open/"))` | \(ms($m; $lo; $hi; $k)) | \(if $m[$k] == null then "-" else ($m[$k].KiB_cached | f(0)) end) |")
' "$load"

echo
echo "Full load, cold and warm (GB/s median [min-max]). x_*: medians of per-repetition ratios to the"
echo "paired baselines; \"/ base\": the row's median over the base/ row's median:"
echo
jq -r "$defs"'
agg("median") as $m | agg("min") as $lo | agg("max") as $hi
| [$m | keys_unsorted[] | select(test("^load/(cold|warm)/[a-z_]+$")) | sub("^load/(cold|warm)/"; "")]
  | uniq as $srcs
| def over($k; $b): if $m[$k] == null or $m[$b] == null then "-"
	else ($m[$k]["GB/s"] / $m[$b]["GB/s"] | f(2)) end;
  "| source | cold GB/s | cold x_read | cold / base read | warm GB/s | warm x_read | warm x_memcpy | warm x_fresh | warm / base memcpy |",
  "|---|---|---|---|---|---|---|---|---|",
  ($srcs[] as $s | ("load/cold/" + $s) as $c | ("load/warm/" + $s) as $w
   | "| `\($s)` | \(gbs($m; $lo; $hi; $c)) | \(ctr($m; $c; "x_read")) | \(over($c; "base/cold/read_4MiB")) | \(gbs($m; $lo; $hi; $w)) | \(ctr($m; $w; "x_read")) | \(ctr($m; $w; "x_memcpy")) | \(ctr($m; $w; "x_fresh")) | \(over($w; "base/warm/memcpy_reused")) |")
' "$load"

echo
echo "Where each source's bytes land:"
echo
jq -r "$defs"'
agg("median") as $m
| [$m | keys_unsorted[] | select(test("^load/(cold|warm)/[a-z_]+$")) | sub("^load/(cold|warm)/"; "")]
  | uniq as $srcs
| "| source | destination |", "|---|---|",
  ($srcs[] as $s | "| `\($s)` | \(($m["load/warm/" + $s] // $m["load/cold/" + $s]).label | ltrimstr("dst: ")) |")
' "$load"

extra=$(jq -r "$defs"'agg("median") | keys_unsorted[] | select(test("host_cold|^tune/"))' "$load")
if [ -n "$extra" ]; then
	echo
	echo "Host-cold and tuning rows (GB/s median [min-max]):"
	echo
	jq -r "$defs"'
	agg("median") as $m | agg("min") as $lo | agg("max") as $hi
	| "| row | GB/s | x_read | x_memcpy | x_fresh |",
	  "|---|---|---|---|---|",
	  ($m | keys_unsorted[] | select(test("host_cold|^tune/")) as $k
	   | "| `\($k)` | \(gbs($m; $lo; $hi; $k)) | \(ctr($m; $k; "x_read")) | \(ctr($m; $k; "x_memcpy")) | \(ctr($m; $k; "x_fresh")) |")
	' "$load"
fi

if [ -n "$open" ]; then
	echo
	echo "Warm open (kiln_model_open + close, file in the page cache; µs, median [min-max]):"
	echo
	jq -r "$defs"'
	def us: . / 1000 | f(1);
	([.benchmarks[] | select(.run_type == "iteration")] | group_by(.run_name)
	  | map({key: (.[0].run_name | short), value: (map(.real_time) | sort)}) | from_entries) as $it
	| agg("median") as $m
	| ($m["warm_open/unnamed/tensors:1"].real_time // null) as $floor
	| "| row | time (µs) | ns per tensor above the 1-tensor open |",
	  "|---|---|---|",
	  ($m | keys | sort_by([(test("unnamed") | not), test("payload"),
	                        (capture("tensors:(?<n>[0-9]+)").n | tonumber), .])[] as $k
	   | ($k | capture("tensors:(?<n>[0-9]+)").n | tonumber) as $n
	   | "| `\($k | ltrimstr("warm_open/"))` | \($m[$k].real_time | us) [\($it[$k][0] | us)-\($it[$k][-1] | us)] | \(if $floor == null or $n < 2 or ($k | test("payload")) then "-" else (($m[$k].real_time - $floor) / ($n - 1) | f(0)) end) |")
	' "$open"
fi
