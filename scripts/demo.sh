#!/bin/sh
# The main job on a generated default input: set up, build, generate a 256 MiB model file with
# `klnt gen`, validate and inspect it, time cold and warm loads with `klnt bench`; then build a
# small file by hand with `klnt pack`, read a tensor back, open stock GGUF and safetensors
# checkpoints as they are, and check the golden cases.
set -eu
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
# The library, klnt and the converters: no test suites, benchmarks or Python module (their
# packages are scripts/test.sh's).
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_BUILD_TESTS=OFF \
	-DKILN_BUILD_BENCH=OFF -DKILN_PYTHON=OFF >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

work=build/demo
rm -rf "$work" && mkdir -p "$work"
trap 'rm -f "$work/model-256M.klnt"' EXIT
run() { # print the command, then run it
	printf '\n$ %s\n' "$*"
	"$@"
}

run build/klnt gen "$work/model-256M.klnt" --tensors 300 --bytes 256M
run build/klnt check "$work/model-256M.klnt"
printf '\n$ build/klnt inspect %s | head -16\n' "$work/model-256M.klnt"
build/klnt inspect "$work/model-256M.klnt" | head -16
run build/klnt bench "$work/model-256M.klnt" --repeat 5

# Raw payloads: an f16 embedding, a 4-bit weight with e8m0 block scales and an f32 outer scale,
# and an opaque foreign block. Deterministic bytes so the demo prints the same every time.
seq 0 2047 | LC_ALL=C awk '{printf "%c%c", $1 % 250 + 1, 60}' >"$work/embed.raw" # f16 [64, 32]
head -c 2048 /dev/zero | tr '\0' '\041' >"$work/w4.raw"                           # e2m1 [64, 64]
head -c 128 /dev/zero | tr '\0' '\177' >"$work/w4.scale.raw"                      # e8m0 [64, 2]
printf '\000\000\200\077' >"$work/w4.outer.raw"                                 # f32 [] = 1.0
head -c 144 /dev/zero | tr '\0' '\001' >"$work/q4k.raw"                           # 8 blocks of 18

run build/klnt pack "$work/model.klnt" \
	--tensor token_embd.weight:f16:64,32:"$work/embed.raw" \
	--tensor blk.0.ffn_up.weight:e2m1:64,64:"$work/w4.raw" \
	--quant 2:1:32:@blk.0.ffn_up.scale:@blk.0.ffn_up.outer \
	--tensor blk.0.ffn_up.scale:e8m0:64,2:"$work/w4.scale.raw" \
	--tensor blk.0.ffn_up.outer:f32::"$work/w4.outer.raw" \
	--tensor blk.0.attn_q.weight:opaque:4096:256:"$work/q4k.raw" --layout Q4_K:18
run build/klnt check "$work/model.klnt"
run build/klnt inspect "$work/model.klnt"
printf '\n$ build/klnt cat %s blk.0.ffn_up.outer | od -An -tf4\n' "$work/model.klnt"
build/klnt cat "$work/model.klnt" blk.0.ffn_up.outer | od -An -tf4
# Stock checkpoints opened as they are, no conversion: files other tools wrote (ggml's GGUF
# writer; a sharded safetensors checkpoint with its index), in tests/samples.
run build/klnt check tests/samples/tiny-llama.gguf tests/samples/tiny-sharded/model.safetensors.index.json
printf '\n$ build/klnt inspect tests/samples/tiny-llama.gguf | head -24\n'
build/klnt inspect tests/samples/tiny-llama.gguf | head -24
printf '\n$ build/klnt cat tests/samples/tiny-sharded/model.safetensors.index.json model.layers.0.self_attn.o_proj.weight_scale | od -An -tf4\n'
build/klnt cat tests/samples/tiny-sharded/model.safetensors.index.json \
	model.layers.0.self_attn.o_proj.weight_scale | od -An -tf4
for f in golden/*.hex; do
	name=$(basename "$f" .hex)
	sed 's/#.*//' "$f" | xxd -r -p >"$work/$name.klnt"
done
printf '\n$ build/klnt check %s/kiln-v2-*.klnt   # the golden cases; two are invalid on purpose\n' "$work"
build/klnt check "$work"/kiln-v2-*.klnt || [ $? -eq 1 ]
