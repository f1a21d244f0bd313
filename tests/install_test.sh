#!/bin/sh
# SPDX-License-Identifier: MIT
#
# Install the build tree into a temporary prefix and use it the ways a consumer would:
#   - nothing installed names the build tree or the configure-time prefix; kiln.pc is relocatable
#     and the CMake package names no absolute library paths;
#   - a program outside the tree (tests/install/) builds and runs with find_package(kiln), shared
#     and static (and links kiln::kiln_cuda where the adapter was built), and with pkg-config,
#     shared and --static; another imports a model through find_package(kiln COMPONENTS
#     convert) (kiln::convert, with json-c found by the package);
#   - the README's first example, as printed there, builds and runs on a .safetensors file;
#   - the klnt man page and bash completion are installed, the page renders without groff
#     warnings and documents every command and option `klnt --help` lists, and the completion
#     offers them.
# Exit 77 (a ctest skip) only when pkg-config is missing.
#
# usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CC EXTRA_FLAGS CONFIGURED_PREFIX
#                        VERSION CUDA(ON|OFF) TOOLS(ON|OFF)
# EXTRA_FLAGS go to the consumer's compile and link (-fsanitize=... under KILN_SANITIZE).
set -u
cmake=$1 build=$2 src=$3 work=$4 cc=$5 flags=$6 conf_prefix=$7 version=$8 cuda=$9
shift 9
tools=$1

fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
ok() { echo "ok: $*"; }

command -v pkg-config >/dev/null 2>&1 || {
	echo "SKIP: pkg-config not found"
	exit 77
}

rm -rf "$work"
mkdir -p "$work" || exit 1
prefix=$work/prefix
if ! "$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
	cat "$work/install.log"
	echo "FAIL: cmake --install"
	exit 1
fi

# --- what was installed --------------------------------------------------------------------------
pc=$(find "$prefix" -name kiln.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || {
	echo "FAIL: no kiln.pc installed"
	exit 1
}
libdir=$(dirname "$(dirname "$pc")")
cmakedir=$libdir/cmake/kiln
for f in "$prefix/include/kiln/kiln.h" "$libdir/libkiln.a" "$cmakedir/kilnConfig.cmake" \
	"$cmakedir/kilnConfigVersion.cmake" "$cmakedir/kilnTargets.cmake" \
	"$prefix/include/kiln/convert.h" "$libdir/libkiln_convert.a" \
	"$cmakedir/kilnConvertTargets.cmake" "$prefix/share/doc/kiln/LICENSE"; do
	[ -f "$f" ] || fail "not installed: ${f#"$prefix"/}"
done
[ -f "$libdir/libkiln.so.$version" ] && [ -L "$libdir/libkiln.so" ] ||
	fail "libkiln.so.$version and its libkiln.so link are not both installed"
if [ "$cuda" = ON ]; then
	for f in "$prefix/include/kiln/kiln_cuda.h" "$libdir/libkiln_cuda.a" \
		"$cmakedir/kilnCudaTargets.cmake"; do
		[ -f "$f" ] || fail "not installed although the CUDA adapter was built: ${f#"$prefix"/}"
	done
else
	[ ! -e "$prefix/include/kiln/kiln_cuda.h" ] ||
		fail "kiln_cuda.h installed without the adapter"
fi
if [ "$tools" = ON ]; then
	man=$prefix/share/man/man1/klnt.1
	comp=$prefix/share/bash-completion/completions/klnt
	for f in "$prefix/bin/klnt" "$man" "$comp"; do
		[ -f "$f" ] || fail "not installed: ${f#"$prefix"/}"
	done
fi

# Text files only: binaries carry the build directory in their debug information, on purpose.
leaks=$(grep -rIl -F -e "$build" -e "$src" "$prefix")
[ -z "$leaks" ] && ok "no installed text file names the build or source tree" ||
	fail "build or source paths in: $leaks"
if command -v readelf >/dev/null 2>&1; then
	for f in "$libdir/libkiln.so.$version" "$prefix/bin/klnt"; do
		[ -f "$f" ] || continue
		readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -q -F "$build" &&
			fail "$f keeps a build-tree RPATH"
	done
fi
abs=$(grep -h 'INTERFACE_LINK_LIBRARIES' "$cmakedir"/*.cmake | grep '/')
[ -z "$abs" ] && ok "the CMake package links targets and names, no absolute paths" ||
	fail "absolute paths in INTERFACE_LINK_LIBRARIES: $abs"
grep -q '^prefix=${pcfiledir}/' "$pc" || fail "kiln.pc does not find its prefix from \${pcfiledir}"
grep -q -F "$conf_prefix" "$pc" && fail "kiln.pc names the configure-time prefix $conf_prefix"

# --- pkg-config ----------------------------------------------------------------------------------
want="kiln $version (header $version): 2 tensors, w is f32, stream ok"
check_run() { # NAME OUTPUT STATUS
	if [ "$3" -eq 0 ] && [ "$2" = "$want" ]; then
		ok "$1 runs"
	else
		fail "$1: status $3, printed '$2', wanted '$want'"
	fi
}
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion kiln)" = "$version" ] || fail "pkg-config --modversion kiln"
incdir=$(pkg-config --variable=includedir kiln)
[ -f "$incdir/kiln/kiln.h" ] && [ "$(cd "$incdir" && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] ||
	fail "pkg-config's includedir $incdir is not $prefix/include"
cflags=$(pkg-config --cflags kiln) && libs=$(pkg-config --libs kiln) &&
	slibs=$(pkg-config --static --libs kiln) || fail "pkg-config --cflags/--libs kiln"
# shellcheck disable=SC2086 # word splitting of the flags is intended
if $cc $flags -o "$work/pc_shared" "$src/tests/install/consumer.c" $cflags $libs; then
	out=$(LD_LIBRARY_PATH="$libdir" "$work/pc_shared" "$work/pc_shared.klnt")
	check_run "pkg-config shared consumer" "$out" $?
else
	fail "pkg-config shared consumer does not build: $cc $flags ... $cflags $libs"
fi
# Static: the archive by name, then what Requires.private adds (liburing, libxxhash).
slibs=$(printf '%s\n' "$slibs" | sed 's/-lkiln\b/-l:libkiln.a/')
# shellcheck disable=SC2086
if $cc $flags -o "$work/pc_static" "$src/tests/install/consumer.c" $cflags $slibs; then
	out=$("$work/pc_static" "$work/pc_static.klnt")
	check_run "pkg-config --static consumer" "$out" $?
	if command -v readelf >/dev/null 2>&1 && readelf -d "$work/pc_static" | grep -q 'libkiln\.so'; then
		fail "the static consumer needs libkiln.so"
	fi
else
	fail "pkg-config --static consumer does not build: $cc $flags ... $cflags $slibs"
fi

# The README's first example, as printed there, on a safetensors file written byte by byte.
readme=$work/readme
mkdir -p "$readme"
{
	printf '#include <stdio.h>\nint main(void)\n{\n'
	sed -n '/^## The API in 20 lines/,/^## /{/^```c$/,/^```$/p}' "$src/README.md" |
		sed '1d;$d' | grep -v '^#include'
	printf 'return 0;\n}\n'
} >"$readme/example.c"
{ printf '#include <kiln/kiln.h>\n'; cat "$readme/example.c"; } >"$readme/main.c"
json='{"model.layers.0.mlp.up_proj.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'
# shellcheck disable=SC2059 # the format is the length's byte, built here
printf "\\$(printf '%03o' ${#json})\\000\\000\\000\\000\\000\\000\\000" >"$readme/model.safetensors"
printf '%s' "$json" >>"$readme/model.safetensors"
head -c 24 /dev/zero >>"$readme/model.safetensors"
# shellcheck disable=SC2086
if grep -q kiln_model_open "$readme/main.c" &&
	$cc $flags -o "$readme/example" "$readme/main.c" $cflags $slibs 2>"$readme/cc.log"; then
	out=$(cd "$readme" && ./example)
	st=$?
	[ $st -eq 0 ] && [ "$out" = "f32 rank 2, 6 elements" ] &&
		ok "the README's first example runs on a .safetensors file" ||
		fail "the README example: status $st, printed '$out'"
else
	cat "$readme/cc.log" 2>/dev/null
	fail "the README's first example does not build"
fi
unset PKG_CONFIG_PATH

# --- find_package(kiln) --------------------------------------------------------------------------
cb=$work/cmake-consumer
if "$cmake" -S "$src/tests/install" -B "$cb" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
	-DKILN_CONSUMER_CUDA="$cuda" >"$work/consumer-configure.log" 2>&1 &&
	"$cmake" --build "$cb" -j1 >"$work/consumer-build.log" 2>&1; then
	found=$(sed -n 's/^kiln_DIR:PATH=//p' "$cb/CMakeCache.txt")
	[ "$(cd "$found" && pwd -P)" = "$(cd "$cmakedir" && pwd -P)" ] ||
		fail "find_package(kiln) found $found, not the installed package"
	out=$("$cb/consumer_shared" "$work/cm_shared.klnt")
	check_run "find_package kiln::kiln consumer" "$out" $?
	out=$("$cb/consumer_static" "$work/cm_static.klnt")
	check_run "find_package kiln::kiln_static consumer" "$out" $?
	out=$("$cb/consumer_convert" "$work/cm_convert.safetensors" "$work/cm_convert.klnt")
	st=$?
	[ $st -eq 0 ] && [ "$out" = "imported 1 tensor, w ok, metadata kept" ] &&
		ok "find_package(kiln COMPONENTS convert) consumer imports a model" ||
		fail "kiln::convert consumer: status $st, printed '$out'"
	if [ "$cuda" = ON ]; then
		out=$("$cb/consumer_cuda")
		[ "$out" = hooks ] && ok "find_package(kiln COMPONENTS cuda) consumer links and runs" ||
			fail "kiln::kiln_cuda consumer printed '$out'"
	fi
else
	cat "$work/consumer-configure.log" "$work/consumer-build.log" 2>/dev/null
	fail "the find_package(kiln) consumer does not configure or build"
fi

# --- man page and completion ---------------------------------------------------------------------
if [ "$tools" = ON ] && [ -f "$prefix/bin/klnt" ]; then
	klnt=$prefix/bin/klnt
	cmp -s "$man" "$src/docs/klnt.1" || fail "the installed man page is not docs/klnt.1"
	grep -q "^\.TH KLNT 1 .*\"kiln $version\"" "$man" || fail "klnt.1's .TH does not say kiln $version"
	if command -v groff >/dev/null 2>&1; then
		warn=$(groff -man -Tutf8 -ww -z "$man" 2>&1)
		[ -z "$warn" ] && ok "klnt.1 renders without groff warnings" || fail "groff: $warn"
	else
		echo "note: groff not found, the man page is not rendered"
	fi
	cmds=$("$klnt" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z]*\) .*/\1/p' | grep -v '^help$')
	[ -n "$cmds" ] || fail "no commands in klnt --help"
	for c in $cmds; do
		grep -q "^\.SS \"klnt $c" "$man" || fail "klnt.1 has no section for klnt $c"
		for o in $("$klnt" "$c" --help | grep -o -e '--[a-z][a-z-]*' | sort -u); do
			grep -q -F -e "$(printf '%s' "$o" | sed 's/-/\\-/g')" "$man" ||
				fail "klnt.1 does not mention klnt $c $o"
		done
	done
	[ -z "$cmds" ] || ok "klnt.1 covers every command and option klnt --help lists"

	if command -v bash >/dev/null 2>&1; then
		# The installed completion, driven as bash-completion drives it.
		if bash -c '
			. "$1"
			klnt=$2 src=$3 cmds=$4
			bad=0
			offer() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _klnt; echo "${COMPREPLY[*]}"; }
			expect() { got=$(offer "${@:2}"); [ "$got" = "$1" ] || { echo "completing [${*:2}]: got [$got], want [$1]"; bad=1; }; }
			complete -p klnt | grep -q -- "-F _klnt" || { echo "klnt is not bound to _klnt"; bad=1; }
			expect "check inspect cat pack gen import export bench load digest verify help" klnt ""
			expect "--chunk --help" klnt digest --
			expect "--quiet --help" klnt verify --
			expect "gguf safetensors" klnt export --to ""
			expect "check" klnt ch
			expect "--help --version" klnt --
			expect "mmap read uring" klnt cat --source ""
			expect "uring uring-direct uring-reuse uring-threads" klnt bench -s u
			expect "inspect" klnt help in
			expect "$src/golden/kiln-v2-f32.hex" klnt check "$src/golden/kiln-v2-f32"
			expect "--read-all" klnt check --r
			for c in $cmds; do
				offered=" $(offer klnt "$c" --) "
				for o in $("$klnt" "$c" --help | grep -o -e "--[a-z][a-z-]*" | sort -u); do
					case $offered in *" $o "*) ;; *) echo "klnt $c: $o is not offered"; bad=1 ;; esac
				done
			done
			exit $bad' sh "$comp" "$klnt" "$src" "$cmds"; then
			ok "the bash completion offers commands, options, option values and files"
		else
			fail "bash completion"
		fi
	else
		echo "note: bash not found, the completion is not exercised"
	fi
fi

if [ "$fails" -ne 0 ]; then
	echo "$fails check(s) failed; the install is left in $work"
	exit 1
fi
rm -rf "$work"
echo "all install checks passed"
