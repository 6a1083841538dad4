"""How a (dtype, op) pair is computed by the hand-written kernels (CuPy and Numba).

Words: a *kind* names the element type a kernel works on, and is the same word in reduce.cu
(``ringcoll::f32``), in the Numba kernels and in the tests: ``f16 bf16 f32 f64`` (half kinds are
stored as 16-bit words and computed in float32, rounded back after every step), ``u8 u16 u32 u64``
and ``i8 i16 i32 i64``. A *word* is the unsigned kind used for bitwise ops, chosen by alignment.

Lowering rules, so that few kernels cover every dtype and no kernel relies on signed overflow:
- signed integer sum/product run on the unsigned kind of the same width (two's complement makes
  them bit-identical and unsigned wrap-around is defined behaviour in C++ and LLVM);
- bool runs on bytes holding 0/1: sum = or, product = and, min = and, max = or (what torch's gloo
  all_reduce does);
- band/bor/bxor do not care about element boundaries, so they run on the widest word that divides
  the byte count and every pointer.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

OP_CODE = {"sum": 0, "product": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
ARITHMETIC_OPS = ("sum", "product", "min", "max")
BITWISE_OPS = ("band", "bor", "bxor")

# One kernel pass reduces up to this many sources; more are reduced in several passes.
MAX_SOURCES = 8

ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8,
            "u8": 1, "u16": 2, "u32": 4, "u64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}

# The (kind, op) pairs that lowering can produce; reduce.cu is instantiated for exactly these.
KIND_OPS = {
    **{k: ARITHMETIC_OPS for k in ("f16", "bf16", "f32", "f64")},
    "u8": ARITHMETIC_OPS + BITWISE_OPS,
    **{k: ("sum", "product") + BITWISE_OPS for k in ("u16", "u32", "u64")},
    **{k: ("min", "max") for k in ("i8", "i16", "i32", "i64")},
}

_FLOAT_KIND = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
               torch.float64: "f64"}
_INT_KINDS = {torch.uint8: ("u8", "u8"), torch.int8: ("i8", "u8"), torch.int16: ("i16", "u16"),
              torch.int32: ("i32", "u32"), torch.int64: ("i64", "u64")}
_BOOL_OP = {"sum": "bor", "product": "band", "min": "band", "max": "bor",
            "band": "band", "bor": "bor", "bxor": "bxor"}


def lower(dtype: torch.dtype, op: str) -> tuple[str, str]:
    """(kind, op) for a validated dtype and op; kind "bytes" means: pick a word with word_kind."""
    if dtype == torch.bool:
        return "bytes", _BOOL_OP[op]
    if op in BITWISE_OPS:
        return "bytes", op
    if dtype in _FLOAT_KIND:
        return _FLOAT_KIND[dtype], op
    ordered, wrapping = _INT_KINDS[dtype]
    return (ordered if op in ("min", "max") else wrapping), op


def word_kind(nbytes: int, pointers: Sequence[int]) -> str:
    """The widest unsigned kind whose size divides the byte count and every address."""
    for size, kind in ((8, "u64"), (4, "u32"), (2, "u16")):
        if nbytes % size == 0 and all(p % size == 0 for p in pointers):
            return kind
    return "u8"


def plan(dst: torch.Tensor, sources: Sequence[torch.Tensor], out: torch.Tensor | None,
         op: str) -> tuple[str, str, int]:
    """(kind, op, element count in that kind) for one reduce_into call."""
    kind, op = lower(dst.dtype, op)
    nbytes = dst.numel() * dst.element_size()
    if kind == "bytes":
        tensors = [dst, *sources] + ([out] if out is not None else [])
        kind = word_kind(nbytes, [t.data_ptr() for t in tensors])
    return kind, op, nbytes // ITEMSIZE[kind]


def passes(sources: Sequence, limit: int = MAX_SOURCES) -> Iterator[tuple[Sequence, bool]]:
    """Split the sources into kernel passes of at most ``limit``; yields (chunk, is_last)."""
    for start in range(0, len(sources), limit):
        yield sources[start:start + limit], start + limit >= len(sources)


PACK_BYTES = 16


def pack_split(pointers: Sequence[int], itemsize: int, n: int) -> tuple[int, int]:
    """(vec, head) for a 16-byte-pack kernel over ``n`` elements at these addresses.

    When every address is the same number of bytes past a 16-byte boundary, the first ``head``
    elements (fewer than a pack) are done one at a time and the rest in packs of ``vec`` elements,
    from an aligned address in every buffer: a ring chunk at an odd offset keeps its packs. When
    the misalignments differ no shift aligns them all: (1, 0), one element at a time.
    """
    vec = PACK_BYTES // itemsize
    offsets = {p % PACK_BYTES for p in pointers}
    if len(offsets) != 1:
        return 1, 0
    offset = offsets.pop()
    if offset % itemsize:  # not element-aligned (never for a tensor's own dtype)
        return 1, 0
    return vec, min(n, (PACK_BYTES - offset) % PACK_BYTES // itemsize)


def probe_data():
    """(dst, src, expected) float32 arrays for the availability probe's one f32 sum."""
    import numpy as np
    dst = np.arange(1, 6, dtype=np.float32)
    src = np.full(5, 0.5, dtype=np.float32)
    return dst, src, dst + src


def check_probe(got, expected) -> None:
    import numpy as np
    if not np.array_equal(got, expected):
        raise RuntimeError(f"the probe kernel computed {list(got)}, expected {list(expected)}")
