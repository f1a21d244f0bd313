#!/bin/sh
# The klnt tool end to end: golden verdicts, every single-defect block of the rules suite through
# `klnt check`, inspect/cat/pack/import/export, I/O errors and exit codes.
# usage: cli_test.sh KLNT TEST_RULES SOURCE_DIR SCRATCH_DIR
set -u
KLNT=$1 RULES=$2 SRC=$3 TMP=$4
rm -rf "$TMP" && mkdir -p "$TMP/defects" || exit 1
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() {
	fail=$((fail + 1))
	echo "FAIL: $*"
}
# expect STATUS COMMAND...: run, keep stdout in $TMP/out, compare the exit status
expect() {
	want=$1
	shift
	"$@" >"$TMP/out" 2>"$TMP/err"
	got=$?
	if [ "$got" -eq "$want" ]; then ok; else bad "exit $got, want $want: $*"; fi
}
has() { # has FILE TEXT
	if grep -qF -- "$2" "$1"; then ok; else bad "'$2' not in $(cat "$1")"; fi
}
unhex() { sed 's/#.*//' "$SRC/golden/$1.hex" | xxd -r -p >"$TMP/$1.klnt"; }

# 1. golden cases: one line per file, the manifest's verdict
grep -v '^#' "$SRC/golden/MANIFEST" | while read -r name len result; do
	unhex "$name"
	size=$(wc -c <"$TMP/$name.klnt")
	[ "$size" -eq "$len" ] || echo "FAIL: $name is $size bytes, manifest says $len"
	if [ "$result" = valid ]; then want="$TMP/$name.klnt: ok" code=0; else
		want="$TMP/$name.klnt: $result: " code=1
	fi
	"$KLNT" check "$TMP/$name.klnt" >"$TMP/out"
	got=$?
	case "$(cat "$TMP/out")" in "$want"*) ;; *) echo "FAIL: $name: $(cat "$TMP/out")" ;; esac
	[ "$got" -eq "$code" ] || echo "FAIL: $name: exit $got, want $code"
done >"$TMP/golden.log"
if [ -s "$TMP/golden.log" ]; then bad "golden: $(cat "$TMP/golden.log")"; else ok; fi

# 2. every single-defect block of the rules suite gets its class from klnt check
KILN_DUMP_DIR="$TMP/defects" "$RULES" >/dev/null 2>&1 || bad "test_rules failed"
n=0
for f in "$TMP"/defects/*.klnt; do
	class=$(basename "$f" | cut -d- -f1)
	line=$("$KLNT" check "$f")
	status=$?
	case "$line" in
	"$f: $class: "*) [ $status -eq 1 ] && ok || bad "$f: exit $status" ;;
	*) bad "$f: want $class, got: $line" ;;
	esac
	n=$((n + 1))
done
[ "$n" -ge 100 ] && ok || bad "only $n defect blocks were dumped"

# 3. several files: one line each, exit 1 when any is invalid
expect 1 "$KLNT" check "$TMP/kiln-v2-f32.klnt" "$TMP/kiln-v2-empty-name-flag.klnt"
[ "$(wc -l <"$TMP/out")" -eq 2 ] && ok || bad "two files, not two lines"
expect 0 "$KLNT" check "$TMP/kiln-v2-f32.klnt" "$TMP/kiln-v2-opaque.klnt"

# 4. I/O and usage errors
expect 3 "$KLNT" check "$TMP/missing.klnt"
has "$TMP/out" "$TMP/missing.klnt: IO: "
expect 3 "$KLNT" check "$TMP"
has "$TMP/out" "$TMP: IO: "
: >"$TMP/empty.klnt"
expect 1 "$KLNT" check "$TMP/empty.klnt"
has "$TMP/out" "$TMP/empty.klnt: LIMIT: "
expect 3 "$KLNT" check "$TMP/missing.klnt" "$TMP/empty.klnt"
expect 2 "$KLNT" check
expect 2 "$KLNT" frobnicate
expect 2 "$KLNT" inspect --no-such-option x
for cmd in check inspect cat pack; do
	expect 0 "$KLNT" "$cmd" --help
	has "$TMP/out" "usage"
done

# 4a. check --read-all: every byte of the file is read (the count is the file's size), then the
# usual verdicts; payload verification still runs
for f in kiln-v2-empty kiln-v2-f32 kiln-v2-f8-pair kiln-v2-scales-outer kiln-v2-opaque; do
	size=$(wc -c <"$TMP/$f.klnt")
	expect 0 "$KLNT" check --read-all "$TMP/$f.klnt"
	case "$(cat "$TMP/out")" in
	"$TMP/$f.klnt: ok ($size bytes read, O_DIRECT)" | "$TMP/$f.klnt: ok ($size bytes read, buffered)") ok ;;
	*) bad "check --read-all $f: $(cat "$TMP/out"), want $size bytes read" ;;
	esac
done
[ -s "$TMP/err" ] && bad "check --read-all: stderr is not a terminal, yet: $(cat "$TMP/err")" || ok
cp "$TMP/kiln-v2-f8-pair.klnt" "$TMP/gap.klnt"
printf '\001' | dd of="$TMP/gap.klnt" bs=1 seek=330 conv=notrunc 2>/dev/null
for opt in "" --read-all; do
	# shellcheck disable=SC2086
	expect 1 "$KLNT" check $opt "$TMP/gap.klnt"
	has "$TMP/out" "$TMP/gap.klnt: TYPE: byte 330 between payloads"
done
expect 1 "$KLNT" check -a "$TMP/kiln-v2-opaque-no-layout.klnt"
has "$TMP/out" "$TMP/kiln-v2-opaque-no-layout.klnt: TYPE: "
expect 3 "$KLNT" check --read-all "$TMP/missing.klnt" "$TMP/kiln-v2-f32.klnt"
has "$TMP/out" "$TMP/missing.klnt: IO: "
has "$TMP/out" "$TMP/kiln-v2-f32.klnt: ok (200 bytes read"
expect 0 "$KLNT" check -q --read-all "$TMP/kiln-v2-f32.klnt"
[ -s "$TMP/out" ] && bad "check -q --read-all printed $(cat "$TMP/out")" || ok
expect 0 "$KLNT" check --help
has "$TMP/out" "--read-all"
has "$TMP/out" "reads only those bytes"

# 4b. check applies each format's own rules to GGUF and safetensors files (made here by hand)
# and names their defects; hostile headers are only printed
pad() { head -c 100 /dev/zero; }
{ printf 'GGUF\003\000\000\000'; pad; } >"$TMP/m.gguf" # no tensors, no keys: valid
expect 0 "$KLNT" check "$TMP/m.gguf"
has "$TMP/out" "$TMP/m.gguf: ok (gguf)"
{ printf 'GGUF\003\000\000\000\001\000\000\000\000\000\000\000'; pad; } >"$TMP/t.gguf"
expect 1 "$KLNT" check "$TMP/t.gguf"
has "$TMP/out" "$TMP/t.gguf: TYPE: tensor 0: empty name"
{ printf 'GGUF\377\377\377\377'; pad; } >"$TMP/huge.gguf"
expect 1 "$KLNT" check --read-all "$TMP/huge.gguf"
has "$TMP/out" "$TMP/huge.gguf: FRAME: unknown GGUF version 4294967295"
{ printf '\016\000\000\000\000\000\000\000{"a":"bcdef"}'; pad; } >"$TMP/m.safetensors"
expect 1 "$KLNT" check "$TMP/m.safetensors"
has "$TMP/out" "$TMP/m.safetensors: TYPE: tensor a: the entry is not an object"
{ printf '\023\000\000\000\000\000\000\000{"__metadata__":{}}'; } >"$TMP/empty.safetensors"
expect 0 "$KLNT" check "$TMP/empty.safetensors"
has "$TMP/out" "$TMP/empty.safetensors: ok (safetensors)"
# a header length past the cap: safetensors by its '{', refused by the format's own limit
{ printf '\377\377\377\377\377\377\377\177{"a":1}'; pad; } >"$TMP/long.bin"
expect 1 "$KLNT" check "$TMP/long.bin"
has "$TMP/out" "$TMP/long.bin: LIMIT: header length 9223372036854775807 is above the 100000000-byte cap"
# bytes like no format: the plain verdict, unless the name says which format's rules to apply
# (64 bytes and more: a shorter file is KLNT's LIMIT, its check order's first)
printf '\377\377\377\377 not a model, and long enough to be judged by its magic alone ......' >"$TMP/junk.bin"
expect 1 "$KLNT" check "$TMP/junk.bin"
has "$TMP/out" 'FRAME: magic is ff ff ff ff, not "KLNT"; not a safetensors or GGUF file either'
printf '\002\000\000\000\000\000\000\000[]' >"$TMP/list.safetensors"
expect 1 "$KLNT" check "$TMP/list.safetensors"
has "$TMP/out" "$TMP/list.safetensors: FRAME: the header does not start with '{' (not a safetensors header)"
# a KLNT file with a bad version is not mistaken for anything else
{ printf 'KLNT\003'; pad; } >"$TMP/v3.klnt"
expect 1 "$KLNT" check "$TMP/v3.klnt"
has "$TMP/out" "FRAME: version is 3, not 2"

# 5. inspect
expect 0 "$KLNT" inspect "$TMP/kiln-v2-scales-outer.klnt"
has "$TMP/out" "block+outer axis=0 group=16 scale=#1 outer=#2"
has "$TMP/out" "payload_base     448"
expect 0 "$KLNT" inspect --json "$TMP/kiln-v2-opaque.klnt"
has "$TMP/out" '"layout": "Q4_K"'
has "$TMP/out" '"block_size": 18'
expect 0 "$KLNT" inspect --json "$TMP/kiln-v2-f16-named.klnt"
has "$TMP/out" '"name": "w"'

# 6. cat: the raw bytes
expect 0 "$KLNT" cat "$TMP/kiln-v2-f32.klnt" '#0'
[ "$(od -An -tx1 "$TMP/out" | tr -d ' \n')" = 0000803f000000c0 ] && ok || bad "cat bytes"
expect 0 "$KLNT" cat "$TMP/kiln-v2-f16-named.klnt" w
[ "$(od -An -tx1 "$TMP/out" | tr -d ' \n')" = 003c ] && ok || bad "cat by name"
expect 1 "$KLNT" cat "$TMP/kiln-v2-f16-named.klnt" nosuch
# every source gives the same bytes
for src in "mmap" "read" "uring" "read --direct" "uring --direct"; do
	# shellcheck disable=SC2086
	expect 0 "$KLNT" cat --source $src "$TMP/kiln-v2-scales-outer.klnt" '#2'
	[ "$(od -An -tx1 "$TMP/out" | tr -d ' \n')" = 0000803f ] && ok || bad "cat --source $src"
done
expect 2 "$KLNT" cat --source mmap --direct "$TMP/kiln-v2-f32.klnt" '#0'
expect 2 "$KLNT" cat --source tape "$TMP/kiln-v2-f32.klnt" '#0'

# 6a. cat --rows / --range, and a series found from any shard
printf '\000\001\002\003\004\005\006\007\010\011\012\013' >"$TMP/m12.raw"
expect 0 "$KLNT" pack "$TMP/ser-00001-of-00002.klnt" --tensor "a:u8:4,3:$TMP/m12.raw"
head -c 6 "$TMP/m12.raw" >"$TMP/m6.raw"
expect 0 "$KLNT" pack "$TMP/ser-00002-of-00002.klnt" --tensor "b:u4:4,3:$TMP/m6.raw"
hexof() { od -An -tx1 "$TMP/out" | tr -d ' \n'; }
expect 0 "$KLNT" cat "$TMP/ser-00002-of-00002.klnt" a # found in the other shard
[ "$(hexof)" = 000102030405060708090a0b ] && ok || bad "cat across shards: $(hexof)"
expect 0 "$KLNT" cat --rows 1:3 "$TMP/ser-00001-of-00002.klnt" a
[ "$(hexof)" = 030405060708 ] && ok || bad "cat --rows: $(hexof)"
expect 0 "$KLNT" cat --range 5:3 "$TMP/ser-00001-of-00002.klnt" '#0'
[ "$(hexof)" = 050607 ] && ok || bad "cat --range: $(hexof)"
expect 0 "$KLNT" cat "$TMP/ser-00001-of-00002.klnt" '#1' # the set index: b, in shard 2
[ "$(hexof)" = 000102030405 ] && ok || bad "cat #1 of the series: $(hexof)"
expect 2 "$KLNT" cat --rows 1:2 "$TMP/ser-00001-of-00002.klnt" b # 3 nibbles a row: odd
has "$TMP/err" "nearest that do are [0, 2)"
expect 0 "$KLNT" cat --rows 2:4 "$TMP/ser-00001-of-00002.klnt" b
[ "$(hexof)" = 030405 ] && ok || bad "cat --rows of u4: $(hexof)"
expect 2 "$KLNT" cat --range 10:5 "$TMP/ser-00001-of-00002.klnt" a
expect 2 "$KLNT" cat --rows 2 "$TMP/ser-00001-of-00002.klnt" a
expect 2 "$KLNT" cat --rows 0:1 --range 0:1 "$TMP/ser-00001-of-00002.klnt" a
expect 0 "$KLNT" check "$TMP/ser-00002-of-00002.klnt"
has "$TMP/out" "ser-00002-of-00002.klnt: ok (2 shards, 2 tensors)"
expect 0 "$KLNT" inspect "$TMP/ser-00001-of-00002.klnt"
has "$TMP/out" "shard  index  dtype"
has "$TMP/out" "in 2 shards"
grep -q '^ *2 *1 *u4 *\[4, 3\]' "$TMP/out" && ok || bad "inspect row of b: $(cat "$TMP/out")"
expect 0 "$KLNT" inspect --json "$TMP/ser-00001-of-00002.klnt"
has "$TMP/out" '"shards"'
has "$TMP/out" '"shard": 2'
# A series name benches the whole set; -reuse rows need one file.
expect 0 "$KLNT" bench "$TMP/ser-00002-of-00002.klnt" --warm --repeat 1
has "$TMP/out" "set of 2 files"
has "$TMP/out" "warm   stream "
! grep -q "reuse" "$TMP/out" && ok || bad "bench of a set ran a -reuse row"
expect 0 "$KLNT" check --read-all "$TMP/ser-00001-of-00002.klnt"
both=$(($(wc -c <"$TMP/ser-00001-of-00002.klnt") + $(wc -c <"$TMP/ser-00002-of-00002.klnt")))
has "$TMP/out" "ok (2 shards, 2 tensors, $both bytes read"
cp "$TMP/ser-00001-of-00002.klnt" "$TMP/dup-00001-of-00002.klnt"
cp "$TMP/ser-00001-of-00002.klnt" "$TMP/dup-00002-of-00002.klnt"
expect 1 "$KLNT" check "$TMP/dup-00001-of-00002.klnt"
has "$TMP/out" "dup-00002-of-00002.klnt: descriptor 0: the name is the same as tensor 0 of"
rm -f "$TMP/ser-00002-of-00002.klnt"
expect 3 "$KLNT" check "$TMP/ser-00001-of-00002.klnt"
has "$TMP/out" "shard 2 of 2 is missing"
expect 3 "$KLNT" cat "$TMP/ser-00001-of-00002.klnt" a
has "$TMP/err" "shard 2 of 2 is missing"

# 7. pack reproduces golden cases byte for byte
printf '\000\000\200\077\000\000\000\300' >"$TMP/f32.raw"
expect 0 "$KLNT" pack "$TMP/p-f32.klnt" --tensor ":f32:2:$TMP/f32.raw"
cmp -s "$TMP/p-f32.klnt" "$TMP/kiln-v2-f32.klnt" && ok || bad "pack f32 differs from golden"
printf '\000\074' >"$TMP/f16.raw"
# named tensors: the golden file is the tensors alone; by default the file also ends with its
# digest table, which checks
expect 0 "$KLNT" pack --no-digests "$TMP/p-f16.klnt" --tensor "w:f16:1:$TMP/f16.raw"
cmp -s "$TMP/p-f16.klnt" "$TMP/kiln-v2-f16-named.klnt" && ok || bad "pack f16-named differs"
expect 0 "$KLNT" pack "$TMP/p-f16d.klnt" --tensor "w:f16:1:$TMP/f16.raw"
cmp -s "$TMP/p-f16d.klnt" "$TMP/kiln-v2-f16-named.klnt" && bad "pack wrote no digest table" || ok
expect 0 "$KLNT" verify "$TMP/p-f16d.klnt"
has "$TMP/out" "xxh3-128 from embedded"
expect 0 "$KLNT" inspect "$TMP/p-f16d.klnt"
has "$TMP/out" "digests          in the file (kiln.digests)"
has "$TMP/out" "1 tensor, 2 tensor bytes + 62 gap bytes + 80 digest table bytes = 144 payload bytes"
expect 0 "$KLNT" inspect --json "$TMP/p-f16d.klnt"
/usr/bin/python3 -c 'import json, sys; h = json.load(open(sys.argv[1]))["header"]; sys.exit(h["digests"] != {"offset": 448, "bytes": 80} or h["tensor_count"] != 1)' "$TMP/out" &&
	ok || bad "inspect --json: the digest table's place"
expect 0 "$KLNT" inspect --json "$TMP/p-f16.klnt"
/usr/bin/python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["header"]["digests"] is not None)' "$TMP/out" &&
	ok || bad "inspect --json: a file without a table"
printf '\020\062\124\166\230\272\334\376' >"$TMP/e2m1.raw"
printf '\070' >"$TMP/f8.raw"
printf '\000\000\200\077' >"$TMP/one.raw"
expect 0 "$KLNT" pack "$TMP/p-so.klnt" --tensor ":e2m1:16:$TMP/e2m1.raw" --quant 2:0:16:1:2 \
	--tensor ":f8e4m3:1:$TMP/f8.raw" --tensor ":f32:1:$TMP/one.raw"
cmp -s "$TMP/p-so.klnt" "$TMP/kiln-v2-scales-outer.klnt" && ok || bad "pack scales-outer differs"
head -c 18 /dev/zero >"$TMP/q.raw"
expect 1 "$KLNT" pack "$TMP/p-bad.klnt" --tensor ":opaque:4096:32:$TMP/q.raw"
has "$TMP/err" "TYPE"
[ ! -e "$TMP/p-bad.klnt" ] && ok || bad "a refused pack left a file"
expect 1 "$KLNT" pack "$TMP/p-bad.klnt" --tensor ":f32:3:$TMP/f32.raw"
expect 3 "$KLNT" pack "$TMP/p-bad.klnt" --tensor ":f32:2:$TMP/missing.raw"

# 8. gen and bench
# without its digest table: the --verify checks below start from a file that has none
expect 0 "$KLNT" gen "$TMP/gen.klnt" --tensors 40 --bytes 2M --no-sync --no-digests
[ ! -s "$TMP/err" ] && ok || bad "gen printed progress without a terminal: $(cat "$TMP/err")"
expect 0 "$KLNT" check "$TMP/gen.klnt"
expect 0 "$KLNT" inspect "$TMP/gen.klnt"
has "$TMP/out" "blk.4.ffn_up.weight"
has "$TMP/out" "block axis=1 group=32"
# its Q4_K blocks carry the code kiln gives GGUF's Q4_K (4096 + 12), so converters know them
grep -Eq "opaque\(4108\) .* Q4_K bs=144 +\"blk\.0\.ffn_down\.weight\"" "$TMP/out" && ok ||
	bad "gen's Q4_K tensor: $(grep ffn_down "$TMP/out" | head -1)"
"$KLNT" gen "$TMP/gen2.klnt" --tensors 40 --bytes 2M --no-sync --no-digests
cmp -s "$TMP/gen.klnt" "$TMP/gen2.klnt" && ok || bad "gen is not deterministic"
expect 0 "$KLNT" gen "$TMP/gend.klnt" --tensors 40 --bytes 2M --no-sync
expect 0 "$KLNT" load "$TMP/gend.klnt" --verify
grep -Eq ": 40 tensors, .*every byte checked against its digests \([0-9]+ chunks\)$" "$TMP/out" &&
	ok || bad "load --verify of a file with its digest table: $(cat "$TMP/out")"
expect 1 "$KLNT" gen "$TMP/gen3.klnt" --tensors 20000 --bytes 1M
has "$TMP/err" "LIMIT"
expect 0 "$KLNT" gen "$TMP/gen3.klnt" --tensors 20000 --bytes 1M --unnamed --no-sync
expect 2 "$KLNT" gen "$TMP/gen4.klnt" --tensors 10
expect 0 "$KLNT" bench "$TMP/gen.klnt" --repeat 1
for src in open mmap mmap-normal mmap-willneed populate auto read uring read-direct uring-direct \
	read-threads uring-threads stream plain plain-fresh plain-fresh-thp cat floor; do
	has "$TMP/out" "warm   $src "
	has "$TMP/out" "cold   $src "
done
has "$TMP/out" "warm   memcpy "
! grep -q "cold   memcpy " "$TMP/out" && ok || bad "bench: memcpy has no cold row"
grep -q "^warm   auto .*(mmap, cached)" "$TMP/out" && ok || bad "bench: warm auto did not map a cached file"
grep -Eq "^warm   open .* [+-][0-9]+\.[0-9]+(us|ms)$" "$TMP/out" && ok || bad "bench: open is not shown against floor"
expect 0 "$KLNT" bench "$TMP/gen.klnt" --warm --source read --repeat 2
[ "$(grep -c '^warm' "$TMP/out")" -eq 7 ] && ok ||
	bad "bench --source read: read and the six plain rows only"
expect 1 "$KLNT" bench "$TMP/kiln-v2-opaque-no-layout.klnt"
expect 2 "$KLNT" bench "$TMP/gen.klnt" --source tape
# --device host: the pipeline against N-thread pread, the ratio its last field, nothing after
expect 0 "$KLNT" bench "$TMP/gen.klnt" --warm --device host --source read --repeat 2
grep -Eq "^warm   device .* [0-9]+\.[0-9]{2}x$" "$TMP/out" && ok || bad "bench: no device row: $(cat "$TMP/out")"
grep -Eq "^warm   plain-threads .*x  \([0-9]+ threads\)$" "$TMP/out" && ok || bad "bench: no plain-threads row"
expect 2 "$KLNT" bench "$TMP/gen.klnt" --device cuda:0
expect 2 "$KLNT" bench "$TMP/gen.klnt" --source device
# --verify: a twin row under each whole-file source, checked against the sidecar; none yet: the
# NOTFOUND that says how to make one.
expect 1 "$KLNT" bench "$TMP/gen.klnt" --warm --source read --repeat 1 --verify
grep -q "make them once with: klnt digest" "$TMP/err" && ok || bad "bench --verify without digests: $(cat "$TMP/err")"
expect 0 "$KLNT" digest "$TMP/gen.klnt"
expect 0 "$KLNT" bench "$TMP/gen.klnt" --warm --source read --source populate --source stream --repeat 2 --verify
grep -Eq "^warm   read\+verify .* [0-9]+\.[0-9]{3}x$" "$TMP/out" && ok || bad "bench --verify: no read+verify row: $(cat "$TMP/out")"
grep -Eq "^warm   populate\+verify " "$TMP/out" && ok || bad "bench --verify: no populate+verify row"
grep -Eq "^warm   stream\+verify .* [0-9]+\.[0-9]{3}x$" "$TMP/out" && ok || bad "bench --verify: no stream+verify row: $(cat "$TMP/out")"
expect 0 "$KLNT" bench "$TMP/gen.klnt" --warm --device host --source read --repeat 2 --verify
grep -Eq "^warm   device\+verify .* [0-9]+\.[0-9]{3}x$" "$TMP/out" && ok || bad "bench --verify: no device+verify row: $(cat "$TMP/out")"
rm -f "$TMP/gen.klnt.kiln-digest"
expect 2 "$KLNT" bench s3://bucket/m.klnt --verify

# 8b. load: every tensor through the pipeline, in a given order, and its errors
expect 0 "$KLNT" load "$TMP/gen.klnt" --threads 3
grep -Eq "^loaded $TMP/gen.klnt: 40 tensors, [0-9]+ bytes to host in .* [1-3] threads, at most [0-9]+ bytes in flight$" "$TMP/out" &&
	ok || bad "load: $(cat "$TMP/out")"
[ ! -s "$TMP/err" ] && ok || bad "load printed progress without a terminal"
printf 'blk.4.ffn_up.weight\nblk.0.ffn_up.weight\n' >"$TMP/order"
expect 0 "$KLNT" load "$TMP/gen.klnt" --order "$TMP/order" --direct --inflight 1M
has "$TMP/out" ": 2 tensors,"
expect 0 "$KLNT" load "$TMP/gen.klnt" --drop-cache --directory-only --threads 2 --inflight 1M
grep -Eq " 2 threads, at most [0-9]+ bytes in flight$" "$TMP/out" && ok || bad "load --inflight 1M: $(cat "$TMP/out")"
printf 'no.such.tensor\n' >"$TMP/order"
expect 1 "$KLNT" load "$TMP/gen.klnt" --order "$TMP/order"
has "$TMP/err" "no tensor named 'no.such.tensor'"
# an order list that names nothing, or is not a file to read, is an error, not "everything"
: >"$TMP/empty-order"
expect 1 "$KLNT" load "$TMP/gen.klnt" --order "$TMP/empty-order"
has "$TMP/err" "names no tensor"
expect 3 "$KLNT" load "$TMP/gen.klnt" --order "$TMP"
has "$TMP/err" "cannot read"
# numbers are parsed strictly: no sign, no space, no overflow, a known suffix; the option named
for bad in -1 18446744073709551616 ' 1' +1 1X 0x10 17179869184T 0; do
	expect 2 "$KLNT" load "$TMP/gen.klnt" --inflight "$bad"
	has "$TMP/err" "--inflight wants a byte count"
done
for bad in -1 99999999999999999999 16777216T; do
	expect 2 "$KLNT" gen "$TMP/never.klnt" --bytes "$bad"
done
[ ! -e "$TMP/never.klnt" ] && ok || bad "gen wrote a file for a refused --bytes"
expect 1 "$KLNT" load "$TMP/kiln-v2-opaque-no-layout.klnt"
expect 2 "$KLNT" load "$TMP/gen.klnt" --device cuda:0
expect 2 "$KLNT" load "$TMP/gen.klnt" --threads 0
expect 3 "$KLNT" load "$TMP/no-such-file.klnt"
# --verify: every byte checked at open against the sidecar, a flipped byte named, none refused
expect 1 "$KLNT" load "$TMP/gen.klnt" --verify
has "$TMP/err" "make them once with: klnt digest"
expect 0 "$KLNT" digest --chunk 64K "$TMP/gen.klnt"
expect 0 "$KLNT" load "$TMP/gen.klnt" --verify --threads 2
grep -Eq "^loaded $TMP/gen.klnt: 40 tensors, .*, every byte checked against its digests \([0-9]+ chunks\)$" "$TMP/out" &&
	ok || bad "load --verify: $(cat "$TMP/out")"
expect 0 "$KLNT" load "$TMP/gen.klnt"
! grep -q "digests" "$TMP/out" && ok || bad "load without --verify said it checked digests"
cp "$TMP/gen.klnt" "$TMP/flip.klnt"
cp "$TMP/gen.klnt.kiln-digest" "$TMP/flip.klnt.kiln-digest"
printf '\377' | dd of="$TMP/flip.klnt" bs=1 seek=$(($(wc -c <"$TMP/flip.klnt") - 7)) conv=notrunc 2>/dev/null
expect 1 "$KLNT" load "$TMP/flip.klnt" --verify
has "$TMP/err" "differs from its digest"
# --directory-only: each part checked as the pipeline reads it (the sidecar's 64 KiB chunks)
expect 0 "$KLNT" load "$TMP/gen.klnt" --verify --directory-only --threads 2
grep -Eq "^loaded $TMP/gen.klnt: 40 tensors, .*, every byte checked against its digests as read \([0-9]+ chunks, [0-9]+ bytes hashed\)$" "$TMP/out" &&
	ok || bad "load --verify --directory-only: $(cat "$TMP/out")"
expect 1 "$KLNT" load "$TMP/flip.klnt" --verify --directory-only
has "$TMP/err" "differs from its digest"
rm -f "$TMP/gen.klnt.kiln-digest" "$TMP/flip.klnt" "$TMP/flip.klnt.kiln-digest"

# 9. writing: a rewrite keeps the mode and follows a symlink; SIGINT/SIGTERM leave nothing
chmod 600 "$TMP/p-f32.klnt"
ln -s p-f32.klnt "$TMP/p-link.klnt"
expect 0 "$KLNT" pack --no-digests "$TMP/p-link.klnt" --tensor "w:f16:1:$TMP/f16.raw"
[ -L "$TMP/p-link.klnt" ] && ok || bad "pack replaced a symlink by a file"
cmp -s "$TMP/p-f32.klnt" "$TMP/kiln-v2-f16-named.klnt" && ok || bad "pack through a symlink"
[ "$(stat -c %a "$TMP/p-f32.klnt")" = 600 ] && ok || bad "pack changed the mode of OUT"
mkdir "$TMP/sig"
if command -v script >/dev/null 2>&1; then # util-linux: stderr on a pseudo-terminal
	script -qc "'$KLNT' gen '$TMP/sig/tty.klnt' --tensors 40 --bytes 4M --no-sync" /dev/null \
		>"$TMP/out" 2>&1
	has "$TMP/out" "klnt gen: 0 of 4 MiB"
	rm -f "$TMP/sig/tty.klnt"
fi
# interrupted SIGNAL STATUS COMMAND...: stop the command after $after seconds (the writes below
# take longer); it must exit with STATUS, say so in one line, and leave $TMP/sig empty. On a
# loaded machine a signal at 0.3 s could come before klnt had installed its handlers: 1 s.
after=1
interrupted() {
	sig=$1 want=$2
	shift 2
	# --foreground: timeout signals only the command, once; otherwise it signals its whole
	# process group as well, and a second signal takes klnt's default action by design (a
	# second Ctrl-C kills), which would race the first one's handler.
	timeout --foreground --preserve-status -k 10 -s "$sig" "$after" "$@" >"$TMP/out" 2>"$TMP/err"
	got=$?
	[ "$got" -eq "$want" ] && ok || bad "exit $got, want $want after SIG$sig: $*"
	has "$TMP/err" "interrupted by SIG$sig; left as it was"
	[ "$(wc -l <"$TMP/err")" -eq 1 ] && ok || bad "not one line: $(cat "$TMP/err")"
	[ -z "$(ls -A "$TMP/sig")" ] && ok || bad "left behind: $(ls -A "$TMP/sig")"
	rm -f "$TMP/sig/"*
}
interrupted TERM 143 "$KLNT" gen "$TMP/sig/g.klnt" --tensors 40 --bytes 3G --no-sync
interrupted INT 130 "$KLNT" gen "$TMP/sig/g.klnt" --tensors 40 --bytes 3G
truncate -s 2G "$TMP/sparse.raw"
interrupted TERM 143 "$KLNT" pack "$TMP/sig/p.klnt" --tensor ":u8:2147483648:$TMP/sparse.raw"
rm -f "$TMP/sparse.raw"
# gen checks the free space first: nothing is written when the file cannot fit
expect 3 "$KLNT" gen "$TMP/sig/huge.klnt" --tensors 40 --bytes 900T
has "$TMP/err" "bytes free; nothing was written"
[ -z "$(ls -A "$TMP/sig")" ] && ok || bad "gen wrote despite the space check"

# 10. import and export (GGUF and safetensors: tests/test_gguf.c, tests/test_safetensors.c; here
# the command line, with KLNT sources, which import re-plans)
expect 0 "$KLNT" import -o "$TMP/imp.klnt" "$TMP/gen.klnt"
has "$TMP/out" "wrote $TMP/imp.klnt: 40 tensors, "
[ ! -s "$TMP/err" ] && ok || bad "import printed progress without a terminal: $(cat "$TMP/err")"
expect 0 "$KLNT" check "$TMP/imp.klnt"
expect 0 "$KLNT" inspect "$TMP/imp.klnt"
has "$TMP/out" "metadata         klnt, 0 keys"
expect 0 "$KLNT" inspect --json "$TMP/imp.klnt"
has "$TMP/out" '"metadata": {'
has "$TMP/out" '"source": "klnt"'
expect 0 "$KLNT" inspect --json "$TMP/gen.klnt"
has "$TMP/out" '"metadata": null'
mkdir "$TMP/series"
expect 0 "$KLNT" import --max-shard-size 256K -o "$TMP/series/s.klnt" "$TMP/imp.klnt"
n=$(ls "$TMP/series" | wc -l)
last=$(printf '%05d-of-%05d' "$n" "$n")
has "$TMP/out" "wrote $TMP/series/s-00001-of-${last#*-of-}.klnt .. $TMP/series/s-$last.klnt ($n files)"
[ "$n" -gt 2 ] && ok || bad "--max-shard-size 256K made $n files"
expect 0 "$KLNT" check "$TMP"/series/s-*.klnt
has "$TMP/out" "s-$last.klnt: ok"
# a series imports back into one file with the same tensors
expect 0 "$KLNT" import -o "$TMP/back.klnt" "$TMP"/series/s-*.klnt
has "$TMP/out" "wrote $TMP/back.klnt: 40 tensors, "
for i in 0 5 39; do
	"$KLNT" cat "$TMP/gen.klnt" "#$i" >"$TMP/a.raw"
	"$KLNT" cat "$TMP/back.klnt" "#$i" >"$TMP/b.raw"
	cmp -s "$TMP/a.raw" "$TMP/b.raw" && ok || bad "tensor $i differs after import"
done
# what is not a model is a clear error, and nothing is written
printf 'just some text, not a model, long enough to be judged by its first bytes alone\n' >"$TMP/notes.txt"
expect 1 "$KLNT" import -o "$TMP/n.klnt" "$TMP/notes.txt"
has "$TMP/err" "$TMP/notes.txt: FRAME: magic is 6a 75 73 74, not \"KLNT\"; not a safetensors or GGUF file either"
expect 3 "$KLNT" import -o "$TMP/n.klnt" "$TMP/missing.gguf"
has "$TMP/err" "$TMP/missing.gguf: IO: "
[ ! -e "$TMP/n.klnt" ] && ok || bad "a failed import wrote its output"
expect 2 "$KLNT" import "$TMP/gen.klnt"
has "$TMP/err" "no output file"
expect 2 "$KLNT" import -o "$TMP/n.klnt"
expect 2 "$KLNT" import --max-shard-size 12Q -o "$TMP/n.klnt" "$TMP/gen.klnt"
expect 2 "$KLNT" import --max-shard-size 0 -o "$TMP/n.klnt" "$TMP/gen.klnt"
expect 2 "$KLNT" export -o "$TMP/n.gguf" "$TMP/imp.klnt"
has "$TMP/err" "no target format"
expect 2 "$KLNT" export --to
expect 2 "$KLNT" export --to xml -o "$TMP/n.x" "$TMP/imp.klnt"
expect 2 "$KLNT" export --to gguf "$TMP/imp.klnt"
expect 2 "$KLNT" export --to safetensors -o "$TMP/n.st"
expect 1 "$KLNT" export --to gguf -o "$TMP/n.gguf" "$TMP/notes.txt"
has "$TMP/err" "$TMP/notes.txt: FRAME: magic is 6a 75 73 74"
for cmd in import export; do
	expect 0 "$KLNT" "$cmd" --help
	has "$TMP/out" "usage: klnt $cmd"
done
# safetensors -> KLNT (one file, or a series) -> safetensors gives the same bytes, metadata
# included (the header as the reference writer lays it out: padded with spaces to 8 bytes)
hdr='{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[],"data_offsets":[8,12]}}   '
{
	printf '\220\0\0\0\0\0\0\0'
	printf '%s' "$hdr"
	printf '\001\002\003\004\005\006\007\010\011\012\013\014'
} >"$TMP/m.safetensors"
expect 0 "$KLNT" import -o "$TMP/st.klnt" "$TMP/m.safetensors"
has "$TMP/out" "wrote $TMP/st.klnt: 2 tensors, 12 payload bytes"
expect 0 "$KLNT" inspect "$TMP/st.klnt"
has "$TMP/out" "metadata         safetensors, 1 key"
expect 0 "$KLNT" verify "$TMP/st.klnt"
has "$TMP/out" "xxh3-128 from embedded"
# the source's bytes again without a digest table; with one (the default), they check
expect 0 "$KLNT" export --no-digests --to safetensors -o "$TMP/back.safetensors" "$TMP/st.klnt"
has "$TMP/out" "wrote $TMP/back.safetensors: 2 tensors, 12 payload bytes"
cmp -s "$TMP/m.safetensors" "$TMP/back.safetensors" && ok || bad "safetensors round trip differs"
expect 0 "$KLNT" export --to safetensors -o "$TMP/backd.safetensors" "$TMP/st.klnt"
expect 0 "$KLNT" verify "$TMP/backd.safetensors"
has "$TMP/out" "xxh3-128 from embedded"
expect 0 "$KLNT" inspect "$TMP/backd.safetensors"
has "$TMP/out" "metadata         safetensors, 1 key"
mkdir "$TMP/stser"
expect 0 "$KLNT" import --max-shard-size 1 -o "$TMP/stser/st.klnt" "$TMP/m.safetensors"
has "$TMP/out" "(2 files)"
expect 0 "$KLNT" verify "$TMP"/stser/st-00001-of-00002.klnt
has "$TMP/out" "2 files, 2 digests"
expect 0 "$KLNT" export --no-digests --to safetensors -o "$TMP/back2.safetensors" "$TMP"/stser/st-0000*.klnt
cmp -s "$TMP/m.safetensors" "$TMP/back2.safetensors" && ok || bad "series round trip differs"
# the shared samples (written by ggml's own GGUF writer and another safetensors writer), when
# the checkout has ../shared/samples beside it: GGUF -> KLNT -> GGUF gives the same file byte
# for byte; the sharded safetensors checkpoint imports through its index
samples="$SRC/../shared/samples"
if [ -f "$samples/tiny-llama.gguf" ]; then
	expect 0 "$KLNT" import -o "$TMP/llama.klnt" "$samples/tiny-llama.gguf"
	has "$TMP/out" "wrote $TMP/llama.klnt: 12 tensors"
	expect 0 "$KLNT" check "$TMP/llama.klnt"
	expect 0 "$KLNT" inspect "$TMP/llama.klnt"
	has "$TMP/out" "metadata         gguf, 12 keys"
	has "$TMP/out" "Q4_K"
	expect 0 "$KLNT" export --no-digests --to gguf -o "$TMP/llama.gguf" "$TMP/llama.klnt"
	cmp -s "$samples/tiny-llama.gguf" "$TMP/llama.gguf" && ok || bad "GGUF round trip differs"
	expect 0 "$KLNT" export --to gguf -o "$TMP/llamad.gguf" "$TMP/llama.klnt"
	expect 0 "$KLNT" verify "$TMP/llamad.gguf"
	has "$TMP/out" "xxh3-128 from embedded"
	expect 0 "$KLNT" inspect "$TMP/llamad.gguf"
	has "$TMP/out" "metadata         gguf, 12 keys"
	expect 0 "$KLNT" import -o "$TMP/sharded.klnt" "$samples/tiny-sharded/model.safetensors.index.json"
	expect 0 "$KLNT" check "$TMP/sharded.klnt"
	expect 0 "$KLNT" cat "$TMP/sharded.klnt" model.layers.0.self_attn.o_proj.weight_scale
	[ "$(wc -c <"$TMP/out")" -eq 4 ] && ok || bad "the rank-0 F32 scale is 4 bytes"
	# the stock files directly, no conversion: check, inspect, cat by name and by index
	expect 0 "$KLNT" check "$samples/tiny-llama.gguf" "$samples/tiny-sharded/model.safetensors.index.json"
	has "$TMP/out" "tiny-llama.gguf: ok (gguf)"
	has "$TMP/out" "model.safetensors.index.json: ok (safetensors, 2 shards, 21 tensors)"
	expect 0 "$KLNT" check "$samples/tiny-sharded/model-00002-of-00002.safetensors"
	has "$TMP/out" "ok (safetensors, 2 shards, 21 tensors)"
	expect 0 "$KLNT" inspect "$samples/tiny-llama.gguf"
	has "$TMP/out" "format           gguf, version 3"
	has "$TMP/out" "alignment        32 (general.alignment)"
	has "$TMP/out" "metadata         gguf, 12 keys"
	has "$TMP/out" "offset  align  quant"
	expect 0 "$KLNT" inspect "$samples/tiny-sharded/model.safetensors.index.json"
	has "$TMP/out" "2 shards (safetensors)"
	has "$TMP/out" "metadata         safetensors, 1 key"
	expect 0 "$KLNT" inspect --json "$samples/tiny-llama.gguf"
	has "$TMP/out" '"format": "gguf"'
	has "$TMP/out" '"key": "tokenizer.ggml.tokens"'
	expect 0 "$KLNT" cat "$samples/tiny-llama.gguf" blk.0.attn_norm.weight
	cp "$TMP/out" "$TMP/a.raw"
	expect 0 "$KLNT" cat "$samples/tiny-llama.gguf" '#1'
	cmp -s "$TMP/a.raw" "$TMP/out" && ok || bad "cat by name and by index differ"
	expect 0 "$KLNT" cat "$TMP/llama.klnt" blk.0.attn_norm.weight
	cmp -s "$TMP/a.raw" "$TMP/out" && ok || bad "cat of the GGUF and of its import differ"
	expect 0 "$KLNT" bench --warm --repeat 1 --source mmap --source read "$samples/tiny-llama.gguf"
	has "$TMP/out" "mmap"
	# any shard of a checkpoint imports the whole of it
	expect 0 "$KLNT" import -o "$TMP/plain.klnt" "$samples/tiny-sharded/model-00002-of-00002.safetensors"
	has "$TMP/out" "wrote $TMP/plain.klnt: 21 tensors"
	rm -f "$TMP/llama.klnt" "$TMP/llama.gguf" "$TMP/sharded.klnt" "$TMP/a.raw" "$TMP/plain.klnt"
else
	echo "note: $samples not found: the shared-sample round trips were skipped"
fi
# the converters refuse, before writing anything: an output named like a shard of a series
# (readers would look for the whole series), and an output that is one of the inputs
expect 1 "$KLNT" import -o "$TMP/x-00001-of-00002.klnt" "$TMP/gen.klnt"
has "$TMP/err" "x-00001-of-00002.klnt: INVAL: the output is named like shard 1 of 2 of a series"
has "$TMP/err" "name it $TMP/x.klnt"
[ ! -e "$TMP/x-00001-of-00002.klnt" ] && [ ! -e "$TMP/x.klnt" ] && ok || bad "a refused import wrote"
expect 1 "$KLNT" export --to safetensors -o "$TMP/x-00001-of-00002.safetensors" "$TMP/st.klnt"
has "$TMP/err" "the output is named like shard 1 of 2"
cp "$TMP/gen.klnt" "$TMP/self.klnt"
expect 1 "$KLNT" import -o "$TMP/self.klnt" "$TMP/self.klnt"
has "$TMP/err" "self.klnt: INVAL: the output is one of the inputs; nothing was written"
cmp -s "$TMP/gen.klnt" "$TMP/self.klnt" && ok || bad "an import over its own input changed it"
ln -sf self.klnt "$TMP/self-link.klnt"
expect 1 "$KLNT" import -o "$TMP/self-link.klnt" "$TMP/self.klnt"
has "$TMP/err" "the output is one of the inputs"
expect 1 "$KLNT" export --to safetensors -o "$TMP/m.safetensors" "$TMP/m.safetensors"
has "$TMP/err" "the output is one of the inputs"
rm -f "$TMP/self.klnt" "$TMP/self-link.klnt"
# a tensor safetensors cannot express: a rejected input (INVAL, exit 1 as for every rejection),
# and nothing written
expect 1 "$KLNT" export --to safetensors -o "$TMP/n.safetensors" "$TMP/gen.klnt"
has "$TMP/err" "$TMP/n.safetensors: INVAL: tensor blk.0.ffn_down.weight: layout Q4_K has no safetensors dtype"
[ ! -e "$TMP/n.safetensors" ] && ok || bad "a failed export wrote its output"
# a file this build cannot take (a KLNT file with unnamed tensors): UNSUPPORTED, exit 1
expect 0 "$KLNT" gen --unnamed --no-sync "$TMP/unnamed.klnt" --tensors 2 --bytes 4K
expect 1 "$KLNT" import -o "$TMP/n.klnt" "$TMP/unnamed.klnt"
has "$TMP/err" "$TMP/unnamed.klnt: UNSUPPORTED: tensor 0 has no name; only named tensors can be converted"
[ ! -e "$TMP/n.klnt" ] && ok || bad "a failed import wrote its output"
# --no-sync writes the same files
expect 0 "$KLNT" export --no-sync --no-digests --to safetensors -o "$TMP/ns.safetensors" "$TMP/st.klnt"
cmp -s "$TMP/m.safetensors" "$TMP/ns.safetensors" && ok || bad "export --no-sync differs"
expect 0 "$KLNT" import --no-sync -o "$TMP/ns.klnt" "$TMP/m.safetensors"
cmp -s "$TMP/st.klnt" "$TMP/ns.klnt" && ok || bad "import --no-sync differs"
# importing to the same OUT again in another form removes the earlier form: a series of
# another count, or the single file (the library's test has the decoys that must stay)
mkdir "$TMP/again"
expect 0 "$KLNT" import --max-shard-size 256K -o "$TMP/again/a.klnt" "$TMP/imp.klnt"
n=$(ls "$TMP/again" | wc -l)
expect 0 "$KLNT" import --max-shard-size 512K -o "$TMP/again/a.klnt" "$TMP/imp.klnt"
has "$TMP/out" "removed $n files of an earlier import to OUT"
m=$(ls "$TMP/again" | wc -l)
[ "$(ls "$TMP/again" | grep -c -- "-of-$(printf %05d "$m").klnt\$")" -eq "$m" ] && ok ||
	bad "a series of $m beside another: $(ls "$TMP/again")"
expect 0 "$KLNT" import -o "$TMP/again/a.klnt" "$TMP/imp.klnt"
has "$TMP/out" "removed $m files of an earlier import to OUT"
[ "$(ls "$TMP/again")" = a.klnt ] && ok || bad "the series stayed beside a.klnt: $(ls "$TMP/again")"
expect 0 "$KLNT" import --max-shard-size 512K -o "$TMP/again/a.klnt" "$TMP/imp.klnt"
has "$TMP/out" "removed 1 file of an earlier import to OUT"
[ ! -e "$TMP/again/a.klnt" ] && ok || bad "a.klnt stayed beside the series"
rm -rf "$TMP/again" "$TMP/unnamed.klnt" "$TMP/ns.klnt" "$TMP/ns.safetensors"
if command -v script >/dev/null 2>&1; then # progress on a terminal only
	script -qc "'$KLNT' import -o '$TMP/tty.klnt' '$TMP/gen.klnt'" /dev/null >"$TMP/out" 2>&1
	has "$TMP/out" "klnt import: "
	has "$TMP/out" " of 2 MiB ("
	rm -f "$TMP/tty.klnt"
fi
# an interrupted import leaves nothing: the source is one u8 tensor "w" of 8 GiB of (sparse)
# zeros: header, descriptor, the name, pad to 256, then truncate makes the payload
{
	echo 4b4c4e54 02 03 0000 01000000 01000000 0000000002000000 8100000000000000
	echo 0000000000000000000000000000000000000000000000000000000000000000
	echo 0200 01 00 0000 0100 ffff 0000 00000000 0000 ffff 00000000 ffffffff ffffffff
	echo 0000000000000000 0000000002000000 0000000002000000
	for i in 1 2 3 4 5 6 7 8 9; do echo 0000000000000000; done # shape[1..7], reserved
	echo 77
} | xxd -r -p >"$TMP/big.klnt"
truncate -s $((256 + 8589934592)) "$TMP/big.klnt"
expect 0 "$KLNT" check "$TMP/big.klnt"
interrupted INT 130 "$KLNT" import -o "$TMP/sig/i.klnt" "$TMP/big.klnt"
interrupted TERM 143 "$KLNT" import --max-shard-size 1M -o "$TMP/sig/i.klnt" "$TMP/gen.klnt" "$TMP/big.klnt"
interrupted TERM 143 "$KLNT" digest "$TMP/big.klnt"
[ -e "$TMP/big.klnt.kiln-digest" ] && bad "digest left a sidecar when interrupted" || ok
rm -f "$TMP/big.klnt"

# 9. digest and verify: a sidecar beside the file, every byte checked, a flipped byte named
cp "$SRC/tests/samples/tiny-llama.gguf" "$TMP/d.gguf"
expect 1 "$KLNT" verify "$TMP/d.gguf"
has "$TMP/out" "$TMP/d.gguf: NOTFOUND: "
has "$TMP/out" "make them once with: klnt digest $TMP/d.gguf"
expect 0 "$KLNT" digest --chunk 4K "$TMP/d.gguf"
has "$TMP/out" "$TMP/d.gguf: 1 file, 19 chunks of 4096 bytes, content "
[ "$(wc -c <"$TMP/d.gguf.kiln-digest")" -eq $((64 + 19 * 16)) ] && ok || bad "sidecar size"
expect 0 "$KLNT" verify "$TMP/d.gguf"
has "$TMP/out" "$TMP/d.gguf: ok (1 file, 19 digests, 76160 bytes, xxh3-128 from sidecar, content "
expect 0 "$KLNT" verify -q "$TMP/d.gguf"
[ -s "$TMP/out" ] && bad "verify -q printed $(cat "$TMP/out")" || ok
printf '\125' | dd of="$TMP/d.gguf" bs=1 seek=50000 conv=notrunc 2>/dev/null
expect 1 "$KLNT" verify "$TMP/d.gguf"
has "$TMP/out" "$TMP/d.gguf: CORRUPT: chunk 12 (bytes 49152..53248, tensor blk.0.ffn_down.weight) differs from its digest: expected XXH3-128 "
expect 3 "$KLNT" verify "$TMP/missing.gguf" "$TMP/d.gguf"
# One chunk of 1 GiB: its digest is the whole file's, as xxhsum (Debian's xxhash) computes it
cp "$SRC/tests/samples/tiny-llama.gguf" "$TMP/e.gguf"
expect 0 "$KLNT" digest --chunk 1G "$TMP/e.gguf"
want=$(xxhsum -H2 <"$TMP/e.gguf" | cut -d' ' -f1)
got=$(od -An -tx1 -j64 -N16 "$TMP/e.gguf.kiln-digest" | tr -d ' \n')
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "digest $got, xxhsum says $want"
expect 2 "$KLNT" digest --chunk 1000 "$TMP/d.gguf"
has "$TMP/err" "--chunk 1000: a power of two from 4096"
expect 2 "$KLNT" verify --chunk 4096 "$TMP/d.gguf"
expect 2 "$KLNT" digest
expect 0 "$KLNT" verify --help
has "$TMP/out" "FILE.kiln-digest"
# A Hugging Face cache layout: the snapshot's name links to blobs/<sha256sum of the file>, a
# digest kiln checks with no sidecar (coreutils' sha256sum names the blob here).
hf="$TMP/hub/models--o--m"
mkdir -p "$hf/blobs" "$hf/snapshots/r1"
cp "$SRC/tests/samples/tiny-llama.gguf" "$TMP/hfsrc.gguf"
blob=$(sha256sum "$TMP/hfsrc.gguf" | cut -d' ' -f1)
mv "$TMP/hfsrc.gguf" "$hf/blobs/$blob"
ln -s "../../blobs/$blob" "$hf/snapshots/r1/model.gguf"
expect 0 "$KLNT" verify "$hf/snapshots/r1/model.gguf"
has "$TMP/out" "model.gguf: ok (1 file, 1 digests, 76160 bytes, sha256 from hf-cache)"
printf '\125' | dd of="$hf/blobs/$blob" bs=1 seek=50000 conv=notrunc 2>/dev/null
expect 1 "$KLNT" verify "$hf/snapshots/r1/model.gguf"
has "$TMP/out" "differ from their SHA-256 in its Hugging Face cache blob name"

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
