# SPDX-License-Identifier: MIT
"""The package's one dtype table: every dtype kiln or safetensors has, what kiln, safetensors'
headers, numpy and PyTorch call it, and how numpy and PyTorch take a view of it. Every dtype
lookup of the package (kiln.save_file, kiln.torch, kiln.safe_open, kiln.safetensors) is derived
from these rows; bits per element are the C library's own (kiln._kiln.dtype_bits).

torch is imported only by the lookups that answer in torch dtypes, so that `import kiln` never
imports it.
"""

from typing import NamedTuple, Optional

import numpy as _np

from ._kiln import dtype_bits as _dtype_bits


class Dtype(NamedTuple):
    """One dtype. ``kiln``: Tensor.dtype ("f32"), None for those kiln holds as opaque;
    ``safetensors``: the header's code (Tensor.safetensors_dtype), None where safetensors has
    none; ``name``: numpy's and PyTorch's name, which safetensors' TensorSpec takes ("float32"),
    None where neither has one; ``numpy``: numpy has the type (without ml_dtypes);
    ``torch_dlpack``: torch.from_dlpack takes kiln's typed capsule of it in every PyTorch kiln
    supports (1.13 up: DLPack bool came in 2.0, torch's wide unsigned types in 2.3)."""

    kiln: Optional[str]
    safetensors: Optional[str]
    name: Optional[str]
    numpy: bool
    torch_dlpack: bool

    @property
    def bits(self):
        """Bits per element as the C library has them, None for kiln's opaque dtypes."""
        return _dtype_bits(self.kiln) if self.kiln else None

    @property
    def numpy_native(self):
        """Tensor.numpy() gives it typed (the others only as raw bytes)."""
        return self.kiln is not None and self.numpy

    def torch_dtype(self):
        """This PyTorch's dtype for one element, or None: the version lacks it (float8 came in
        2.1, e8m0 in 2.7, the wide unsigned types in 2.3), or the element is under a byte
        (torch's float4_e2m1fn_x2 is a pair of them)."""
        if self.name is None or (self.kiln is not None and self.bits < 8):
            return None
        import torch

        return getattr(torch, self.name, None)

    def same_width(self):
        """The numpy integer type as wide as one element (torch.from_numpy takes it in every
        version), to carry the bytes of a dtype numpy lacks."""
        return int_of_width(self.bits // 8)


def int_of_width(nbytes):
    """The numpy integer type of nbytes bytes (1, 2, 4 or 8)."""
    return _np.dtype(f"i{nbytes}")


# In the order safetensors lists TensorSpec's names when it refuses one (the names must stay in
# it); kiln's sub-byte integers, which neither safetensors nor the frameworks have, last.
ROWS = (
    #     kiln      safetensors    name                numpy  torch_dlpack
    Dtype("bool",   "BOOL",        "bool",             True,  False),
    Dtype("i8",     "I8",          "int8",             True,  True),
    Dtype("u8",     "U8",          "uint8",            True,  True),
    Dtype("i16",    "I16",         "int16",            True,  True),
    Dtype("u16",    "U16",         "uint16",           True,  False),
    Dtype("i32",    "I32",         "int32",            True,  True),
    Dtype("u32",    "U32",         "uint32",           True,  False),
    Dtype("i64",    "I64",         "int64",            True,  True),
    Dtype("u64",    "U64",         "uint64",           True,  False),
    Dtype("f16",    "F16",         "float16",          True,  True),
    Dtype("f32",    "F32",         "float32",          True,  True),
    Dtype("f64",    "F64",         "float64",          True,  True),
    Dtype("bf16",   "BF16",        "bfloat16",         False, True),
    Dtype("f8e4m3", "F8_E4M3",     "float8_e4m3fn",    False, False),
    Dtype(None,     "F8_E4M3FNUZ", "float8_e4m3fnuz",  False, False),
    Dtype("f8e5m2", "F8_E5M2",     "float8_e5m2",      False, False),
    Dtype(None,     "F8_E5M2FNUZ", "float8_e5m2fnuz",  False, False),
    Dtype("e8m0",   "F8_E8M0",     "float8_e8m0fnu",   False, False),
    Dtype("e2m1",   "F4",          "float4_e2m1fn_x2", False, False),
    Dtype(None,     "C64",         "complex64",        True,  False),
    Dtype(None,     "F6_E2M3",     None,               False, False),
    Dtype(None,     "F6_E3M2",     None,               False, False),
    Dtype("u4",     None,          None,               False, False),
    Dtype("i4",     None,          None,               False, False),
)

# The lookups: by kiln's name, by the header's code, by numpy's/torch's name (in ROWS' order).
KILN = {r.kiln: r for r in ROWS if r.kiln}
SAFETENSORS = {r.safetensors: r for r in ROWS if r.safetensors}
NAMES = {r.name: r for r in ROWS if r.name}
# numpy dtype -> kiln's name, for the arrays KLNT holds as they are.
KILN_OF_NUMPY = {_np.dtype(r.name): r.kiln for r in ROWS if r.numpy_native}


def torch_dtypes():
    """Every dtype this PyTorch has by a row's name (float4_e2m1fn_x2, a pair, too)."""
    import torch

    return [getattr(torch, r.name) for r in ROWS if r.name and hasattr(torch, r.name)]
