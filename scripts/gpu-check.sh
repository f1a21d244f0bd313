#!/bin/sh
# The device check: build kiln with the CUDA adapter, run the adapter's tests (and kiln.cuda's,
# where the Python module is built and the machine's python3 has numpy and pytest), and benchmark
# loading a file into GPU memory through the pinned staging ring (bench/bench_cuda.c: cold and
# warm, every source, against cudaMemcpy from pinned memory and against a plain read of the same
# file, GB/s and ratios). Takes under 2 minutes with a GPU (80 s on an H200 host, results in
# docs/benchmarks.md), plus the build; without one it builds, runs the
# tests that need no device, prints "no GPU: <reason>" and exits 0.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--no-build] [--bundle] [--size MIB] [--reps N]
#                        [--out DIR] [--targets] [--target-sizes "MIB ..."]
#
#   --build-dir DIR  where to build (default build-gpu)
#   --no-build       use what DIR already holds (for example a bundle made elsewhere)
#   --bundle         after building, copy the shared libraries the two programs need (but glibc
#                    and the CUDA driver) into DIR/lib, so DIR runs on a machine with a GPU and
#                    the CUDA driver but without this project's Debian packages
#   --size MIB       size of the benchmark file (default 1024)
#   --reps N         repetitions per benchmark row (default 5)
#   --out DIR        also keep the benchmark's JSON (bench_cuda.json) and the test log there
#   --targets        instead of the full table: the GPU issue's targets, for each size and for a
#                    KLNT and a safetensors file of the same tensors: kiln_load warm against
#                    cudaMemcpy from pinned memory (>= 0.8x), cold with O_DIRECT against
#                    dd iflag=direct bs=16M of the same file (>= 0.9x), staged and registered,
#                    with the pinned and extra device bytes kiln_load counted; and the staged
#                    pipeline with every chunk hashed against the unverified one (>= 0.95x, the
#                    integrity issue's); one verdict line each (about 3 minutes on an H200 with
#                    --reps 3, before the verified rows)
#   --target-sizes S file sizes in MiB for --targets (default "1024 8192")
#
# The benchmark file goes under DIR (it must be on a disk-backed file system: eviction is checked
# with mincore) and is removed when the benchmark exits.
set -eu

build=build-gpu
do_build=1
bundle=0
size=1024
reps=5
out=""
targets=0
target_sizes="1024 8192"
while [ $# -gt 0 ]; do
	case $1 in
	--build-dir) build=$2; shift 2 ;;
	--no-build) do_build=0; shift ;;
	--bundle) bundle=1; shift ;;
	--size) size=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--targets) targets=1; shift ;;
	--target-sizes) target_sizes=$2; shift 2 ;;
	-h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
src=$(cd "$(dirname "$0")/.." && pwd)
start=$(date +%s)

if [ "$do_build" = 1 ]; then
	mkdir -p "$build"
	cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
		>"$build/gpu-check-configure.log" 2>&1 || { cat "$build/gpu-check-configure.log"; exit 1; }
	if ! grep -q "building kiln_cuda" "$build/gpu-check-configure.log"; then
		echo "gpu-check: the CUDA toolkit was not found (nvcc, libcudart): nothing to check"
		echo "no GPU: no CUDA toolkit"
		exit 0
	fi
	cmake --build "$build" -j"$(nproc)" --target test_cuda bench_cuda
	# The Python module with its CUDA views, where Python's headers are here.
	cmake --build "$build" -j"$(nproc)" --target kiln_python >/dev/null 2>&1 ||
		echo "gpu-check: the Python module was not built (no Python headers): its check is skipped"
fi
test_bin=$build/tests/test_cuda
bench_bin=$build/bench/bench_cuda
for b in "$test_bin" "$bench_bin"; do
	[ -x "$b" ] || { echo "gpu-check: $b is missing (build first, without --no-build)" >&2; exit 1; }
done

if [ "$bundle" = 1 ]; then
	mkdir -p "$build/lib"
	# Everything the programs load but glibc itself and the driver, which belong to the machine.
	# shellcheck disable=SC2046 # the module's path, when there is one
	ldd "$test_bin" "$bench_bin" $(ls "$build"/python/kiln/_kiln*.so 2>/dev/null) | awk '/=> \// {print $3}' | sort -u |
		grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libcuda)\.so' |
		while read -r lib; do cp -L "$lib" "$build/lib/"; done
	echo "gpu-check: bundled $(ls "$build/lib" | wc -l) libraries into $build/lib"
fi
if [ -d "$build/lib" ]; then
	LD_LIBRARY_PATH="$(cd "$build/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	export LD_LIBRARY_PATH
fi

echo "== CUDA adapter tests"
[ -n "$out" ] && mkdir -p "$out"
set +e
mkdir -p "$build/test-tmp"
KILN_TEST_TMPDIR="$build/test-tmp" "$test_bin" --verbose=0 >"$build/test_cuda.log" 2>&1
trc=$?
set -e
cat "$build/test_cuda.log"
[ -n "$out" ] && cp "$build/test_cuda.log" "$out/"
[ "$trc" = 0 ] || { echo "gpu-check: the CUDA adapter tests failed" >&2; exit 1; }

py=$build/python
if nm -D "$py"/kiln/_kiln*.so 2>/dev/null | grep -q __asan_init; then
	# A sanitized module needs the ASan runtime preloaded into the interpreter.
	echo "== kiln.cuda: skipped (the module is built with ASan)"
elif ls "$py"/kiln/_kiln*.so >/dev/null 2>&1 &&
	/usr/bin/python3 -c 'import numpy, pytest' 2>/dev/null; then
	echo "== kiln.cuda: DLPack views on the GPU (python/tests/test_cuda.py)"
	PYTHONPATH="$py" /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs \
		"$src/python/tests/test_cuda.py" || { echo "gpu-check: kiln.cuda failed" >&2; exit 1; }
else
	echo "== kiln.cuda: skipped (no module built, or this python3 lacks numpy or pytest)"
fi

# run_bench TXT [VAR=VALUE...] PROGRAM [ARG...]: bench_cuda under env, its output in TXT, its file
# under the build directory (removed after); exits 0 at "no GPU" and 1 when it fails.
run_bench() {
	txt=$1
	shift
	mkdir -p "$build/bench-files"
	set +e
	env KILN_BENCH_DIR="$build/bench-files" KILN_BENCH_REPS="$reps" "$@" >"$txt" 2>&1
	rc=$?
	set -e
	rm -rf "$build/bench-files"
	if [ "$rc" = 77 ]; then
		cat "$txt"
		echo "gpu-check: CUDA adapter built and its no-device tests passed; nothing to benchmark"
		exit 0
	fi
	[ "$rc" = 0 ] || { cat "$txt"; echo "gpu-check: bench_cuda failed ($rc)" >&2; exit 1; }
}

if [ "$targets" = 1 ]; then
	# The rows the targets compare; the load rows pair only cudaMemcpy (warm) and dd (cold).
	filter='^(base/h2d_pinned|base/cold/dd_direct_16MiB|pipeline/(warm|cold)/mmap(/direct)?(/register|/verify)?)/'
	for mib in $target_sizes; do
		for fmt in klnt safetensors; do
			echo "== targets: $fmt, $mib MiB, $reps repetitions per row"
			txt=${out:-$build}/targets-$fmt-$mib.txt
			run_bench "$txt" KILN_BENCH_SIZE_MIB="$mib" KILN_BENCH_FORMAT=$fmt \
				KILN_BENCH_PAIR=targets "$bench_bin" --benchmark_filter="$filter"
			grep -E '^device:|SKIPPED|ERROR' "$txt" || true
			# Medians over repetitions; each ratio is per repetition against its own pairing.
			awk -v fmt="$fmt" -v mib="$mib" '
				/_median/ {
					name = $1
					sub(/\/iterations:.*/, "", name)
					delete c
					for (i = 2; i <= NF; i++)
						if (split($i, kv, "=") == 2)
							c[kv[1]] = kv[2]
					rate[name] = c["GB/s"]
					order[++rows] = name
					if (name ~ /\/verify$/) {
						printf "  %s %s MiB %s: %s GB/s\n", fmt, mib, name, c["GB/s"]
						next
					}
					if (name ~ /^pipeline\/warm/) {
						r = c["x_h2d"]; want = 0.8; what = "cudaMemcpy from pinned memory"
					} else if (name ~ /^pipeline\/cold/) {
						r = c["x_dd"]; want = 0.9; what = "dd iflag=direct bs=16M"
					} else {
						printf "  %s %s MiB %s: %s GB/s\n", fmt, mib, name, c["GB/s"]
						next
					}
					printf "  %s %s MiB %s: %s GB/s = %sx %s (target %.1fx: %s); pinned %s MiB, extra device %s B, largest tensor %s MiB\n",
						fmt, mib, name, c["GB/s"], r, what, want,
						(r + 0 >= want ? "met" : "MISSED"), c["pinned_MiB"],
						c["extra_dev_B"], c["largest_MiB"]
				}
				# Integrity (issue 30): each chunk hashed as it lands, against the same
				# pipeline unverified in the same run (the ratio of the two medians).
				END {
					for (k = 1; k <= rows; k++) {
						v = order[k]
						if (v !~ /\/verify$/)
							continue
						u = v
						sub(/\/verify$/, "", u)
						if (rate[u] + 0 <= 0 || rate[v] + 0 <= 0) {
							printf "  %s %s MiB %s: no unverified twin or no rate (target 0.95x: MISSED)\n",
								fmt, mib, v
							continue
						}
						r = rate[v] / rate[u]
						printf "  %s %s MiB %s: %.3fx the unverified pipeline (target 0.95x: %s)\n",
							fmt, mib, v, r, (r >= 0.95 ? "met" : "MISSED")
					}
				}' "$txt"
		done
	done
	echo "gpu-check: done in $(($(date +%s) - start)) s"
	exit 0
fi

echo "== host-to-device loading, ${size} MiB, $reps repetitions per row"
txt=${out:-$build}/bench_cuda.txt
json=${out:+--benchmark_out=$out/bench_cuda.json --benchmark_out_format=json}
# shellcheck disable=SC2086 # $json is empty or two arguments
run_bench "$txt" KILN_BENCH_SIZE_MIB="$size" "$bench_bin" $json
# The medians over repetitions, one row each: GB/s and the ratios (bench/bench_cuda.c says what
# each one compares with).
grep -E '^device:' "$txt" || true
grep -E '_median|SKIPPED|ERROR' "$txt" |
	sed -e 's#/iterations:[0-9]*/repeats:[0-9]*/real_time_median# #' -e 's/  */ /g'
echo "gpu-check: done in $(($(date +%s) - start)) s"
