#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Seed inputs for fuzz_safetensors, beside the committed seed-* files: headers written here byte
# by byte (not by kiln): escapes in names and metadata (U+0000, a surrogate pair, control
# characters, an escaped field key), an empty name, a null __metadata__, tensors misaligned for
# their dtype (what KILN_OPEN_ALIGN copies), a header padded with spaces as writers pad it, and
# a header longer than the 64 KiB kiln reads first (many tensors and metadata): seed-big-header
# belongs in fuzz/large/safetensors/ (fuzz/large/README.md), the others in
# fuzz/corpus/safetensors/.
#
# usage: fuzz/make-safetensors-seeds.py OUT_DIR
import struct
import sys

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64,
        "I64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "F8_E4M3": 8, "F8_E5M2": 8,
        "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64, "F8_E4M3FNUZ": 8,
        "F8_E5M2FNUZ": 8}


def st(tensors, meta=None, pad=0, raw_meta=None):
    """tensors: (name as JSON text without quotes, dtype, shape) in data order."""
    parts, off, data = [], 0, b""
    if raw_meta is not None:
        parts.append('"__metadata__":' + raw_meta)
    elif meta is not None:
        parts.append('"__metadata__":{' + ",".join(f'"{k}":"{v}"' for k, v in meta) + "}")
    for name, dt, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        nbytes = n * BITS[dt] // 8
        parts.append(f'"{name}":{{"dtype":"{dt}","shape":{list(shape)},'
                     f'"data_offsets":[{off},{off + nbytes}]}}'.replace(" ", ""))
        data += bytes((i * 13 + off) & 255 for i in range(nbytes))
        off += nbytes
    head = ("{" + ",".join(parts) + "}").encode() + b" " * pad
    return struct.pack("<Q", len(head)) + head + data


def raw(head, data):
    return struct.pack("<Q", len(head)) + head + data


seeds = {
    "seed-escapes": st([("a\\u0000b", "U8", [2]), ("\\ud83d\\ude00", "F16", [1]),
                        ("\\n\\t\\\"\\\\\\/", "I8", [1]), ("", "BOOL", [1])],
                       meta=[("k\\u00e9y", "v\\u0000al"), ("plain", "\\ud800\\udc00")]),
    "seed-escaped-field": raw(b'{"x":{"\\u0064type":"U8","sh\\u0061pe":[2],'
                              b'"data_offsets":[0,2]}}', b"\x01\x02"),
    "seed-meta-null": st([("w", "F32", [1])], raw_meta="null"),
    "seed-misaligned": st([("u8", "U8", [1]), ("f32", "F32", [2]), ("i16", "I16", [3]),
                           ("f64", "F64", [1]), ("c64", "C64", [1]), ("f4", "F4", [2])]),
    "seed-padded": st([("w", "BF16", [2, 2])], meta=[("format", "pt")], pad=7),
    "seed-big-header": st([(f"model.layers.{i}.weight", "U8", [1]) for i in range(900)],
                          meta=[(f"key{i}", "v\\u00e9" * 4) for i in range(300)]),
}
for name, data in seeds.items():
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(data)
