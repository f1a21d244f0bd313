#!/bin/sh
# Seed inputs for the fuzz targets: the golden cases (hex -> binary) and every single-defect
# block of the rules suite (tests/helpers.c writes them to $KILN_DUMP_DIR), plus a few decoded
# tensor lists for the round-trip and lookup targets. The committed corpus in fuzz/corpus/ is
# these seeds plus what the long runs found, minimized to a set that keeps every covered edge
# (-merge=1 -use_counters=0), with the golden cases kept for parse; this script is how to start
# over.
#
# usage: fuzz/make-seeds.sh BUILD_DIR OUT_DIR   (BUILD_DIR holds tests/test_rules and klnt)
set -eu
build=$1
out=$2
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/parse" "$out/roundtrip" "$out/lookup"

for f in "$src"/golden/*.hex; do
	sed 's/#.*//' "$f" | xxd -r -p >"$out/parse/golden-$(basename "$f" .hex)"
done
dump=$(mktemp -d)
KILN_DUMP_DIR=$dump "$build/tests/test_rules" --jobs 1 >/dev/null 2>&1
for f in "$dump"/*; do
	cp "$f" "$out/parse/rules-$(basename "$f" .klnt)"
done
rm -rf "$dump"

# Round trip: byte 0 is the tensor count (mod 9) and flags; then per tensor a selector, dtype,
# rank, dims, and so on (see decode() in fuzz_roundtrip.c).
printf '\001\000\013\001\002\007' >"$out/roundtrip/f32-2"
printf '\021\000\011\001\001\001w\003' >"$out/roundtrip/f16-named"
printf '\002\100\020\001\040\001\000\000\001\000\000\017\001\001\000\005' \
	>"$out/roundtrip/e2m1-scale"
printf '\001\005\000\000\001\040\004Q4_K\022\002\011' >"$out/roundtrip/opaque"
# Lookup: byte 0 is the mode (2: prefix + counter), then names or a prefix and a count.
printf '\000\003\001a\002bc\003def\001a\002bc\001z' >"$out/lookup/three"
printf '\002\020blk.0.ffn_up.wei\364\001\001x' >"$out/lookup/prefix-500"
printf '\006\004blk.\320\007' >"$out/lookup/duplicate-counter"

# Digest tables: byte 0 odd takes the rest as it is, even has its own digest recomputed first
# (fuzz_digest.c); tables from klnt digest of a golden case (1 MiB chunks: one) and of a GGUF
# sample (4 KiB chunks: 19), and a table cut inside its head.
mkdir -p "$out/digest"
tmp=$(mktemp -d)
cp "$out/parse/golden-kiln-v2-f32" "$tmp/g.klnt"
cp "$src/tests/samples/tiny-llama.gguf" "$tmp/a.gguf"
"$build/klnt" digest "$tmp/g.klnt" >/dev/null
"$build/klnt" digest --chunk 4K "$tmp/a.gguf" >/dev/null
{ printf '\001'; cat "$tmp/g.klnt.kiln-digest"; } >"$out/digest/klnt-1m"
{ printf '\001'; cat "$tmp/a.gguf.kiln-digest"; } >"$out/digest/gguf-4k"
{ printf '\000'; cat "$tmp/a.gguf.kiln-digest"; } >"$out/digest/gguf-4k-resealed"
{ printf '\001'; head -c 40 "$tmp/g.klnt.kiln-digest"; } >"$out/digest/short"
rm -rf "$tmp"

# model_signing statements (fuzz_signing.c: byte 0 bit 0 looks up "." rather than "m", bit 1
# wraps the rest in a bundle): model_signing's own fixtures, a real bundle as it is and its
# statement, and a statement that lists "m".
mkdir -p "$out/signing"
ms="$src/tests/samples/model-signing"
{ printf '\000'; cat "$ms/v1.1.0-sigstore/model.sig"; } >"$out/signing/bundle"
{ printf '\001'; cat "$ms/sample_model_file_small_shards.json"; } >"$out/signing/shards-dot"
{ printf '\003'; cat "$ms/sample_model_file_small_shards.json"; } >"$out/signing/shards-dot-wrapped"
{ printf '\000'; sed 's|"d0/f00:0:23"|"m:0:23"|; s|"d0/f01:0:23"|"m:23:40"|' \
	"$ms/sample_model_folder_shard.json"; } >"$out/signing/shards-m"
