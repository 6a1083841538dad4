"""Numba backends: one generated kernel per (kind, op), compiled for the CPU (``njit``) or for
CUDA (``numba.cuda.jit``) from the same body.

The body reduces up to MAX_SOURCES sources in one pass over memory (``nsrc`` says how many of
s0..s7 are real; the rest are ``dst`` again and never read) and, when ``fused``, also writes the
result to ``out``. Half kinds are computed in float32 and rounded back after every step, so the
result is bit-identical to torch's sequence of in-place ops: on the CPU both half kinds are 16-bit
words converted by bit arithmetic; on CUDA f16 uses Numba's native float16 (one rounding per op)
and bf16 the same bit arithmetic as the CPU.

The CPU kernels are serial (``nogil``): ``parallel=True`` is faster only in an otherwise idle
single process, oversubscribes the cores that rank processes share, and compiles slower (see
MEASUREMENTS.md). The CUDA kernels take any arrays
Numba's CUDA target accepts: torch tensors through ``__cuda_array_interface__`` (zero-copy), or,
under ``NUMBA_ENABLE_CUDASIM=1``, ``cuda.to_device`` copies of numpy arrays (the test suite's
path).

numba and numba.cuda are imported on first use, not with ringcoll.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ._lowering import MAX_SOURCES, check_probe, passes, plan, probe_data

# The expression combining accumulator ``a`` with source element ``x``. min/max propagate NaN
# like torch.minimum/maximum; for integers ``a != a`` is always false.
_EXPR = {
    "sum": "a + x",
    "product": "a * x",
    "min": "a if a != a else (x if (x != x or x < a) else a)",
    "max": "a if a != a else (x if (x != x or x > a) else a)",
    "band": "a & x",
    "bor": "a | x",
    "bxor": "a ^ x",
}

# Storage dtype of each kind, per target (CUDA has a native float16, the CPU target has not).
_CPU_DTYPE = {"f16": np.uint16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64,
              "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
              "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64}
_CUDA_DTYPE = {**_CPU_DTYPE, "f16": np.float16}

# Conversions (up: storage -> arithmetic, down: arithmetic -> storage) per target; absent = none.
_CPU_CONVERT = {"f16": ("_f16_up", "_f16_down"), "bf16": ("_bf16_up", "_bf16_down")}
_CUDA_CONVERT = {"bf16": ("_bf16_up", "_bf16_down")}


# ---- bit-level half conversions (compiled by Numba; plain Python under the CUDA simulator) ----

def _bf16_up(h):
    return np.uint32(np.uint32(h) << 16).view(np.float32)


def _bf16_down(a):
    # Round to nearest even, NaN -> 0x7fc0: the same bits as torch's c10::BFloat16.
    u = np.float32(a).view(np.uint32)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(0x7FC0)
    return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


def _f16_up(h):
    h = np.uint32(h)
    sign = (h & 0x8000) << 16
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0:  # zero or subnormal: mantissa * 2**-24 is exact in float32
        value = np.float32(mantissa) * np.float32(5.960464477539063e-08)
        return -value if sign else value
    if exponent == 31:  # inf or NaN
        bits = sign | 0x7F800000 | (mantissa << 13)
    else:
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13)
    return np.uint32(bits).view(np.float32)


def _f16_down(a):
    # Round to nearest even (F. Giesen's float_to_half_fast3_rtne), NaN -> 0x7e00 | sign.
    u = np.float32(a).view(np.uint32)
    sign = u & 0x80000000
    u = u ^ sign
    if u >= 0x47800000:  # overflows to inf, or is inf/NaN
        bits = 0x7E00 if u > 0x7F800000 else 0x7C00
    elif u < 0x38800000:  # subnormal or zero: let the float adder round at 2**-24
        rounded = np.uint32(u).view(np.float32) + np.float32(0.5)
        bits = np.float32(rounded).view(np.uint32) - 0x3F000000
    else:
        bits = (u - 0x38000000 + 0xFFF + ((u >> 13) & 1)) >> 13
    return np.uint16(bits | (sign >> 16))


_HELPERS = (_bf16_up, _bf16_down, _f16_up, _f16_down)


def kernel_source(target: str, kind: str, op: str) -> str:
    """Python source of the kernel for one (kind, op); target is "cpu" or "cuda"."""
    up, down = (_CPU_CONVERT if target == "cpu" else _CUDA_CONVERT).get(kind, ("", ""))
    expr = _EXPR[op]
    if down and op in ("sum", "product"):  # min/max/bitwise results are already representable
        expr = f"{up}({down}({expr}))"
    params = ", ".join(f"s{j}" for j in range(MAX_SOURCES))
    lines = [f"def reduce_{kind}_{op}(dst, out, {params}, nsrc, fused):"]
    if target == "cpu":
        lines.append("    for i in range(dst.size):")
    else:
        lines += ["    i = cuda.grid(1)", "    stride = cuda.gridsize(1)",
                  "    while i < dst.size:"]
    body = [f"a = {up}(dst[i])", f"x = {up}(s0[i])", f"a = {expr}"]
    for j in range(1, MAX_SOURCES):
        body += [f"if nsrc > {j}:", f"    x = {up}(s{j}[i])", f"    a = {expr}"]
    body += [f"v = {down}(a)", "dst[i] = v", "if fused:", "    out[i] = v"]
    if target == "cuda":
        body.append("i += stride")
    lines += ["        " + line for line in body]
    return "\n".join(lines) + "\n"


def _compile(target: str, kind: str, op: str, namespace: dict, decorate):
    source = kernel_source(target, kind, op)
    exec(compile(source, f"<ringcoll.kernels {target} kernel {kind} {op}>", "exec"), namespace)
    return decorate(namespace[f"reduce_{kind}_{op}"])


# ---- CPU ----

@functools.lru_cache(maxsize=None)
def _cpu_helpers() -> dict:
    import numba
    return {f.__name__: numba.njit(f) for f in _HELPERS}


@functools.lru_cache(maxsize=None)
def cpu_kernel(kind: str, op: str):
    import numba
    return _compile("cpu", kind, op, {"np": np, **_cpu_helpers()}, numba.njit(nogil=True))


def signature(target: str, kind: str) -> tuple:
    """The argument types of every launch of a kind's kernel (:func:`launch`'s: ``dst``, ``out``
    and eight sources, 1-D C-contiguous arrays of the kind's storage dtype on ``target``, then
    the source count and ``fused``): what the kernel is compiled for ahead of its first launch."""
    import numba

    array = numba.types.Array(numba.from_dtype((_CPU_DTYPE if target == "cpu" else _CUDA_DTYPE)[kind]), 1, "C")
    return (array,) * (2 + MAX_SOURCES) + (numba.int64, numba.boolean)


def cpu_compiled(kind: str, op: str):
    """The CPU kernel of (kind, op), compiled now for :func:`signature` (``njit`` compiles at the
    first call otherwise: on the emulator, on the stream's thread, in the middle of a call)."""
    kernel = cpu_kernel(kind, op)
    kernel.compile(signature("cpu", kind))
    return kernel


def _host_array(t: torch.Tensor, kind: str) -> np.ndarray:
    return t.detach().view(torch.uint8).numpy().view(_CPU_DTYPE[kind])


def reduce_into_cpu(dst: torch.Tensor, sources: list[torch.Tensor], op: str,
                    out: torch.Tensor | None) -> None:
    """dst = dst (op) sources..., out = dst if given; flat contiguous CPU tensors, numel > 0."""
    cpu_launch(dst, sources, op, out)()


def cpu_launch(dst: torch.Tensor, sources: list[torch.Tensor], op: str, out: torch.Tensor | None):
    """:func:`reduce_into_cpu` split as a GPU splits it: the kernel compiled now (the host's
    part), the computation returned as a function to run (the device's)."""
    kind, op, _ = plan(dst, sources, out, op)
    kernel = cpu_compiled(kind, op)
    arrays = (_host_array(dst, kind), [_host_array(s, kind) for s in sources],
              None if out is None else _host_array(out, kind))
    return lambda: launch(kernel, *arrays)


def launch(kernel, dst, sources, out) -> None:
    """Run a kernel over arrays, MAX_SOURCES sources per pass; ``kernel`` may be a configured
    CUDA launch (``kernel[blocks, threads, stream]``)."""
    for chunk, last in passes(sources):
        padding = [dst] * (MAX_SOURCES - len(chunk))
        fused = last and out is not None
        kernel(dst, out if fused else dst, *chunk, *padding, len(chunk), fused)


# ---- CUDA ----

THREADS = 256
BLOCKS_PER_SM = 16


@functools.lru_cache(maxsize=None)
def _cuda_helpers() -> dict:
    import warnings
    from numba import cuda
    # Small tensors make small grids; Numba would warn about occupancy at every such launch.
    # (No category: numba-cuda and numba's built-in CUDA target raise different classes.)
    warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU")
    return {f.__name__: cuda.jit(device=True)(f) for f in _HELPERS}


@functools.lru_cache(maxsize=None)
def cuda_kernel(kind: str, op: str):
    from numba import cuda
    return _compile("cuda", kind, op, {"np": np, "cuda": cuda, **_cuda_helpers()}, cuda.jit)


def cuda_compiled(kind: str, op: str, device: int):
    """The CUDA kernel of (kind, op), compiled through NVVM for :func:`signature` and its module
    loaded on cuda:``device`` now (``cuda.jit`` does both at the first launch otherwise: inside
    a collective, after its first transfer was posted). The simulator
    (``NUMBA_ENABLE_CUDASIM=1``) has nothing to compile or load."""
    from numba import cuda
    kernel = cuda_kernel(kind, op)
    if hasattr(kernel, "compile"):
        with cuda.gpus[device]:
            kernel.compile(signature("cuda", kind)).bind()   # bind: loaded in this device's context
    return kernel


def cuda_dtype(kind: str):
    """Element dtype of device arrays for ``kind`` (what cuda_kernel expects)."""
    return _CUDA_DTYPE[kind]


@functools.lru_cache(maxsize=None)
def _max_blocks(device: int) -> int:
    from numba import cuda
    with cuda.gpus[device]:
        return cuda.get_current_device().MULTIPROCESSOR_COUNT * BLOCKS_PER_SM


def probe(device: int) -> None:
    """Compile the f32 sum kernel through NVVM and run it on five elements; raise if either
    fails or the result is wrong (kernels.auto's availability check)."""
    from numba import cuda
    kernel = cuda_kernel("f32", "sum")  # NVVM compiles it at the first launch
    dst, src, expected = probe_data()
    with cuda.gpus[device]:
        on_device = cuda.to_device(dst)
        launch(kernel[1, 32], on_device, [cuda.to_device(src)], None)
        check_probe(on_device.copy_to_host(), expected)


def reduce_into_cuda(dst: torch.Tensor, sources: list[torch.Tensor], op: str,
                     out: torch.Tensor | None) -> None:
    """dst = dst (op) sources..., out = dst if given; flat contiguous CUDA tensors, numel > 0."""
    from numba import cuda
    kind, op, n = plan(dst, sources, out, op)
    device = dst.device.index
    kernel = cuda_compiled(kind, op, device)

    def device_array(t):
        return cuda.as_cuda_array(t.detach().view(torch.uint8)).view(_CUDA_DTYPE[kind])

    blocks = max(1, min(-(-n // THREADS), _max_blocks(device)))
    with cuda.gpus[device]:
        # torch's default stream is the legacy default stream, handle 0: Numba's default_stream()
        handle = torch.cuda.current_stream(dst.device).cuda_stream
        stream = cuda.external_stream(handle) if handle else cuda.default_stream()
        launch(kernel[blocks, THREADS, stream], device_array(dst),
               [device_array(s) for s in sources],
               None if out is None else device_array(out))
