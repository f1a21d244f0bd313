#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Seed inputs for fuzz_gguf: a few small valid GGUF files covering every value type, nested
# arrays, non-UTF-8 string values, rank 0 and zero-size tensors, block types (one tensor of
# every ggml type), 64- and 8192-byte alignment, version 2 and split.* keys (one file of a
# split of two, which a path refuses and a buffer reads alone), and a header longer than the
# 64 KiB kiln reads first (a vocabulary). Written here byte by byte (not by kiln), so the
# fuzzer starts from files kiln did not lay out itself. big-header*.gguf belong in
# fuzz/large/gguf/ (fuzz/large/README.md), the others in fuzz/corpus/gguf/.
#
# usage: fuzz/make-gguf-seeds.py OUT_DIR
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FIXED = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
         BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# id: (elements per block, bytes per block)
TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
         8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
         13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
         18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
         23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
         29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36),
         41: (128, 18)}


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        it, items = v
        return struct.pack("<IQ", it, len(items)) + b"".join(val(it, x) for x in items)
    return struct.pack(FIXED[t], v)


def gguf(kvs, tensors, version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    off, infos, data = 0, b"", []
    for name, ne, ty in tensors:
        blck, size = TYPES[ty]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // blck * size
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", ty, off)
        data.append(bytes((i * 7 + off) & 255 for i in range(nbytes)))
        off += (nbytes + align - 1) // align * align
    out += infos
    out += b"\0" * (-len(out) % align)
    for d in data:
        out += d + b"\0" * (-len(d) % align)
    return out


seeds = {
    "empty": gguf([], []),
    "values": gguf([
        ("general.architecture", STR, "llama"), ("u8", U8, 255), ("i8", I8, -1),
        ("u16", U16, 65535), ("i16", I16, -2), ("u32", U32, 7), ("i32", I32, -3),
        ("f32", F32, 1e-5), ("bool", BOOL, 1), ("u64", U64, 2**64 - 1), ("i64", I64, -2**63),
        ("f64", F64, -0.0), ("bytes", STR, b"\xff\xfe"),
        ("tokens", ARR, (STR, ["<s>", "\u2581a", "b"])),
        ("nested", ARR, (ARR, [(I32, [1, 2]), (U8, []), (ARR, [(BOOL, [1])])])),
    ], [("token_embd.weight", [64, 2], 8), ("norm", [8], 0)]),
    "types-v2-align64": gguf([("general.alignment", U32, 64)], [
        ("q4k", [256, 1], 12), ("q6k", [256, 2], 14), ("iq2", [256], 16),
        ("mx", [32, 3], 39), ("bf", [4, 2], 30), ("scalar", [], 28), ("empty", [0, 4], 26),
        ("\u0432\u0435\u0441", [2], 1)], version=2, align=64),
    "split-single": gguf([("split.no", U16, 0), ("split.count", U16, 1),
                          ("split.tensors.count", I32, 1)], [("w", [4], 0)]),
    "split-two": gguf([("split.no", U16, 0), ("split.count", U16, 2),
                       ("split.tensors.count", I32, 2)], [("w", [4], 0)]),
    "every-type": gguf([], [(f"t{ty}", [blck], ty) for ty, (blck, size) in sorted(TYPES.items())]),
    "align-8192-rank4": gguf([("general.alignment", U32, 8192)], [
        ("r4", [2, 1, 3, 2], 0), ("zero", [4, 0, 2], 1), ("r1", [3], 24)], align=8192),
    # The vocabulary starts at byte 69 and takes 16 bytes a token, so the first 64 KiB (what
    # kiln reads first) end inside a token's bytes; with the first token 4 bytes longer, inside
    # a length.
    "big-header": gguf([("tokenizer.ggml.tokens", ARR, (STR, [f"tok{i:05}" for i in range(5000)])),
                        ("tokenizer.ggml.scores", ARR, (F32, [i / 8 for i in range(100)]))],
                       [("token_embd.weight", [32, 4], 8), ("norm", [8], 0)]),
    "big-header-cut-length": gguf([("tokenizer.ggml.tokens", ARR,
                                    (STR, ["tok-first-12"] + [f"tok{i:05}" for i in range(4999)]))],
                                  [("norm", [8], 0)]),
}
for name, data in seeds.items():
    with open(f"{sys.argv[1]}/{name}.gguf", "wb") as f:
        f.write(data)
