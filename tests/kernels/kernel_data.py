"""Data with known reductions, and exact comparison: what tests/kernels/test_kernels.py and
tools/gpu_check.py check every backend with (test data, not installed with the library).

``exact_case`` builds operands whose reduction is known in closed form, computed here in Python
integers/floats: integer sums wrap around (large values), integer products wrap (small factors),
float sums and products stay exactly representable in every float dtype (halves; powers of two),
and float min/max carry a NaN in dst and in the last source to check NaN propagation. No case is
all zeros. ``subnormal_case`` does the same with subnormal floats (small multiples of each float
dtype's smallest subnormal), whose exact results a kernel that flushes subnormals to zero (CUDA's
-ftz=true) gets wrong. ``random_float_case`` is the complement: random floats where every step rounds, whose
only oracle is torch's own sequence of in-place ops.
"""
from __future__ import annotations

import contextlib
import random
import sys
import types

import torch

from ringcoll.kernels import LOCAL_OPS, _TORCH_INPLACE

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
DTYPES = FLOATS + INTS + (torch.bool,)
# every (dtype, op) reduce_into accepts, complex aside
PAIRS = [(d, op) for d in DTYPES for op in LOCAL_OPS
         if op not in ("band", "bor", "bxor") or d not in FLOATS]


def _wrap(value: int, dtype: torch.dtype) -> int:
    bits = torch.iinfo(dtype).bits
    if dtype == torch.uint8:
        return value % (1 << bits)
    return (value + (1 << bits - 1)) % (1 << bits) - (1 << bits - 1)


def _values(rng: random.Random, dtype: torch.dtype, op: str, numel: int) -> list:
    if dtype == torch.bool:
        return [rng.random() < 0.5 for _ in range(numel)]
    if dtype in FLOATS:
        if op == "product":  # products of these stay exact powers of two, in range for fp16
            return [rng.choice((1.0, -1.0, 2.0, -2.0, 0.5, -0.5)) for _ in range(numel)]
        return [rng.randint(-8, 8) / 2 for _ in range(numel)]  # sums of 10 stay exact in bf16
    info = torch.iinfo(dtype)
    if op == "sum":  # large values so sums wrap around
        return [rng.randint(info.max // 2, info.max) for _ in range(numel)]
    if op == "product":
        low = 1 if dtype == torch.uint8 else -9
        return [rng.choice([v for v in range(low, 10) if v]) for _ in range(numel)]
    return [rng.randint(info.min, info.max) for _ in range(numel)]


def _combine(dtype: torch.dtype, op: str, a, x):
    if dtype == torch.bool:
        op = {"sum": "bor", "product": "band", "min": "band", "max": "bor"}.get(op, op)
    if op in ("min", "max") and isinstance(a, float) and (a != a or x != x):
        return a if a != a else x
    result = {"sum": lambda: a + x, "product": lambda: a * x, "min": lambda: min(a, x),
              "max": lambda: max(a, x), "band": lambda: a & x, "bor": lambda: a | x,
              "bxor": lambda: a ^ x}[op]()
    return _wrap(result, dtype) if dtype in INTS else result


def exact_case(dtype: torch.dtype, op: str, nsrc: int, numel: int, seed: int = 0):
    """(dst, sources, expected): CPU tensors whose reduction is known exactly."""
    rng = random.Random(f"{dtype}{op}{nsrc}{numel}{seed}")
    if dtype.is_complex:  # sum only: the real view, two floats per element
        real = torch.float32 if dtype == torch.complex64 else torch.float64
        dst, sources, expected = exact_case(real, op, nsrc, 2 * numel, seed)
        as_complex = lambda t: torch.view_as_complex(t.view(-1, 2))  # noqa: E731
        return as_complex(dst), [as_complex(s) for s in sources], as_complex(expected)
    rows = [_values(rng, dtype, op, numel) for _ in range(nsrc + 1)]
    if dtype in FLOATS and op in ("min", "max") and numel > 3:
        rows[0][1] = float("nan")
        rows[-1][2] = float("nan")
    expected = list(rows[0])
    for row in rows[1:]:
        expected = [_combine(dtype, op, a, x) for a, x in zip(expected, row)]
    tensor = lambda values: torch.tensor(values, dtype=dtype)  # noqa: E731
    return tensor(rows[0]), [tensor(r) for r in rows[1:]], tensor(expected)


# The smallest positive subnormal of each float dtype.
SMALLEST_SUBNORMAL = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133,
                      torch.float32: 2.0 ** -149, torch.float64: 2.0 ** -1074}


def subnormal_case(dtype: torch.dtype, op: str, nsrc: int, numel: int, seed: int = 0):
    """(dst, sources, expected): CPU float tensors of subnormals (and some zeros), for sum,
    product, min and max, with exactly known results: sums of k * tiny stay multiples of tiny
    (exact), products scale by +-1 and +-2 (exact), min/max order subnormals against zero and
    each other, so a kernel that compares subnormals as 0 picks the wrong one."""
    rng = random.Random(f"subnormal{dtype}{op}{nsrc}{numel}{seed}")
    tiny = SMALLEST_SUBNORMAL[dtype]
    multiples = [k for k in range(-8, 9) if k]

    def value(row: int) -> float:
        if op == "product" and row > 0:
            return rng.choice((1.0, -1.0, 2.0, -2.0))
        if op in ("min", "max") and rng.random() < 0.25:
            return 0.0
        return rng.choice(multiples) * tiny

    rows = [[value(r) for _ in range(numel)] for r in range(nsrc + 1)]
    expected = list(rows[0])
    for row in rows[1:]:
        expected = [_combine(dtype, op, a, x) for a, x in zip(expected, row)]
    tensor = lambda values: torch.tensor(values, dtype=dtype)  # noqa: E731
    return tensor(rows[0]), [tensor(r) for r in rows[1:]], tensor(expected)


def random_float_case(dtype: torch.dtype, op: str, nsrc: int, numel: int, seed: int = 0):
    """(dst, sources, expected): random floats; expected from torch's in-place ops on the CPU,
    one rounding per step."""
    g = torch.Generator().manual_seed(seed * 1000 + nsrc * 10 + numel)
    draw = lambda: (torch.randn(numel, generator=g, dtype=torch.float64) * 3.7).to(dtype)  # noqa
    dst, sources = draw(), [draw() for _ in range(nsrc)]
    expected = dst.clone()
    for s in sources:
        _TORCH_INPLACE[op](expected, s)
    return dst, sources, expected


def first_difference(got: torch.Tensor, expected: torch.Tensor, *, bits: bool = False):
    """None when ``got`` equals ``expected`` (NaNs compared as NaNs; with ``bits``, floats are
    compared bit for bit, signed zeros included), else how many elements differ and the first."""
    if got.dtype.is_floating_point or got.dtype.is_complex:
        nan = torch.isnan(expected)
        misplaced = torch.isnan(got).ne(nan).nonzero().flatten()
        if misplaced.numel():
            return f"NaN placement differs, first at index {misplaced[0].item()}"
        got, expected = got[~nan], expected[~nan]
        if bits and got.dtype.is_floating_point:
            ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
            got, expected = got.view(ints), expected.view(ints)
    wrong = (got != expected).nonzero().flatten()
    if wrong.numel() == 0:
        return None
    i = wrong[0].item()
    return (f"{wrong.numel()} wrong, first at index {i}: got {got[i].item()}, "
            f"expected {expected[i].item()}")


@contextlib.contextmanager
def fake_cupy(monkeypatch, get_function, *, load=None, stream: int = 0, compile_module=None,
              devices=None):
    """``ringcoll.kernels._cupy`` against a fake CuPy, for dispatch tests without a GPU: a
    compute-capability 9.0 device with 2 SMs, ``get_function(mangled) -> launch(grid, block,
    args)``, ``load(binary)`` on each module load, ``stream`` as torch's current stream handle,
    and a compile step (``compile_module(kind, nsrc, arch)``) that by default returns each name
    expression as its own mangled name; ``devices`` (a list) receives the index of every
    ``cupy.cuda.Device(index)`` made.
    ``monkeypatch`` is pytest's; _cupy's caches are cleared on entry and on exit."""
    from ringcoll.kernels import _cupy, _nvrtc

    class Module:
        def load(self, binary):
            if load is not None:
                load(binary)

        def get_function(self, mangled):
            return get_function(mangled)

    class Device:
        compute_capability = "90"

        def __init__(self, index=0):
            if devices is not None:
                devices.append(index)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cuda = types.SimpleNamespace(
        Device=Device, function=types.SimpleNamespace(Module=Module),
        ExternalStream=lambda handle, device: contextlib.nullcontext(),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda d: {"multiProcessorCount": 2},
                                      getDeviceCount=lambda: 2))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(_cupy, "compile_module", compile_module or (
        lambda kind, nsrc, arch: _nvrtc.Compiled(
            b"", "", {n: n for n in _cupy.kernel_names(kind, nsrc)}, ())))
    monkeypatch.setattr(_nvrtc, "arch_option", lambda capability: f"-arch=sm_{capability}")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=stream))
    cached = (_cupy._arch, _cupy._module, _cupy._kernel, _cupy._max_blocks, _cupy._stream)
    for fn in cached:
        fn.cache_clear()
    try:
        yield
    finally:
        for fn in cached:
            fn.cache_clear()
