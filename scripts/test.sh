#!/bin/sh
# Every test: set up, build with gcc (warnings are errors) and run the suites, then build with
# clang under AddressSanitizer + UndefinedBehaviorSanitizer and run them again, then the
# concurrency suite under ThreadSanitizer, then run each
# libFuzzer target for a minute (KILN_FUZZ_SECONDS), then check formatting. Exits non-zero on
# the first failure.
set -eu
cd "$(dirname "$0")/.."
scripts/setup-debian.sh --tests
jobs=$(nproc)

echo "== gcc, -Werror"
# Everything on, whatever an earlier configure of build/ (scripts/demo.sh's) left in its cache.
CC=gcc CXX=g++ cmake -S . -B build -DKILN_WERROR=ON -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON \
	-DKILN_PYTHON=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure)

echo "== pip: a wheel built offline, installed in a venv, the Python suite run against it"
rm -rf build-pip build-setuptools
mkdir build-pip
/usr/bin/python3 -m pip wheel --no-build-isolation --no-index --no-deps -w build-pip/wheel . \
	>build-pip/wheel.log 2>&1 || { cat build-pip/wheel.log; exit 1; }
/usr/bin/python3 -m venv --system-site-packages build-pip/venv
build-pip/venv/bin/python -m pip install --no-index --no-deps build-pip/wheel/kiln-*.whl >/dev/null
# From outside the source tree, so that only the installed package can be imported.
(cd build-pip && venv/bin/python -c 'import kiln, sys; sys.exit("/build-pip/venv/" not in kiln.__file__)' &&
	KILN_GOLDEN_DIR="$PWD/../golden" KILN_KLNT="$PWD/../build/klnt" KILN_TEST_INSTALLED=1 \
		PYTHONDONTWRITEBYTECODE=1 \
		venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$PWD/pytest-tmp" \
		../python/tests)

echo "== clang, ASan + UBSan, -Werror"
CC=clang CXX=clang++ cmake -S . -B build-asan -DKILN_WERROR=ON -DKILN_SANITIZE=ON \
	-DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure)

echo "== clang, ThreadSanitizer: the concurrency suite"
CC=clang CXX=clang++ cmake -S . -B build-tsan -DKILN_TSAN=ON -DKILN_WERROR=ON -DCMAKE_BUILD_TYPE=Debug \
	-DKILN_BUILD_TOOLS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF >/dev/null
cmake --build build-tsan -j"$jobs" --target test_threads
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" build-tsan/tests/test_threads

echo "== clang, libFuzzer: ${KILN_FUZZ_SECONDS:-60} s per target"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DKILN_FUZZ=ON -DKILN_WERROR=ON \
	-DKILN_BUILD_TESTS=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF >/dev/null
cmake --build build-fuzz -j"$jobs"
fuzz/run.sh build-fuzz "${KILN_FUZZ_SECONDS:-60}"

echo "== format"
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find include src tests tools -name '*.[ch]')
clang-format --dry-run --Werror $files
echo "all tests passed"
