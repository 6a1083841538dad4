"""Local reductions: the one dispatch every reduce step of every algorithm goes through.

Words: ``op`` is a *local* operator name, one of ``LOCAL_OPS``; the collective-level
ReduceOps map onto them in ``ringcoll.ops`` (AVG = SUM then ``divide_``; PREMUL_SUM =
``scale_`` then SUM). A *backend* is who computes a reduce_into: ``torch`` (in-place ops),
``cupy`` (reduce.cu through NVRTC, CUDA tensors), ``numba`` (generated kernels: ``numba.cuda``
for CUDA tensors, ``njit`` for CPU tensors), or ``auto``.

Choosing the backend, first match wins:
1. ``reduce_into(..., backend=name)``: strict, a backend that cannot serve the tensor raises;
2. ``set_backend(name)``;
3. the environment variable ``RINGCOLL_KERNELS`` (read at every call);
4. ``"auto"``.
A global choice (2, 3) of ``cupy`` names the backend for CUDA tensors only; CPU tensors then use
auto's choice. A CUDA backend is available when its package imports, sees a device, and its
real f32 sum kernel compiles and computes the right result on five elements (the probe, once per
process and device: on the device of the tensors reduced, or the one :func:`prepare` names). When auto finds no CuPy or no GPU it falls back (cupy, then numba, then torch) and says
so once at debug level on the ``ringcoll.kernels`` logger (at warning level when a probe kernel
failed to compile or run, with the reason); an explicit backend that is
missing raises RuntimeError. auto on CPU tensors is torch: measured on a 2-core machine, torch is
as fast as the Numba kernels for one source, and Numba's one-pass n-ary/fused kernel (1.1x
faster at 16 Mi elements, up to 1.8x on a busy machine) does not repay its compile time
(0.6-2 s per kind and op in every rank process); see MEASUREMENTS.md.

Importing this module imports neither CuPy nor Numba: they load on first use.
"""
from __future__ import annotations

import importlib.util
import logging
import threading
from functools import lru_cache
from typing import Sequence, Union

import torch

from ..config import settings

LOCAL_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor")
BACKENDS = ("auto", "cupy", "numba", "torch")
ENV_VAR = "RINGCOLL_KERNELS"

# dtypes every op accepts; bitwise ops also need an integer or bool dtype. Complex tensors are
# accepted for "sum" only and reduced as their real view.
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool)
_INTEGRAL = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)
_COMPLEX = (torch.complex64, torch.complex128)
_BITWISE = ("band", "bor", "bxor")

logger = logging.getLogger("ringcoll.kernels")

_TORCH_INPLACE = {
    "sum": lambda dst, src: dst.add_(src) if dst.dtype != torch.bool else dst.logical_or_(src),
    "product": lambda dst, src: dst.mul_(src) if dst.dtype != torch.bool else dst.logical_and_(src),
    "min": lambda dst, src: torch.minimum(dst, src, out=dst),
    "max": lambda dst, src: torch.maximum(dst, src, out=dst),
    "band": lambda dst, src: dst.bitwise_and_(src),
    "bor": lambda dst, src: dst.bitwise_or_(src),
    "bxor": lambda dst, src: dst.bitwise_xor_(src),
}

_configured: str | None = None
_logged: set = set()


# ---- selection ----

def set_backend(name: str | None) -> None:
    """Choose the backend for every later reduce_into; None goes back to $RINGCOLL_KERNELS/auto.

    Raises ValueError for an unknown name and RuntimeError when the named package (cupy, numba)
    is not installed; whether a GPU is usable is checked at the first CUDA tensor.
    """
    global _configured
    if name is not None:
        _check_name(name, "set_backend")
        if name in ("cupy", "numba") and not _installed(name):
            raise RuntimeError(f"set_backend({name!r}): the {name} package is not installed")
    _configured = name


def get_backend() -> str:
    """The configured backend name: set_backend's, else $RINGCOLL_KERNELS, else "auto"."""
    if _configured is not None:
        return _configured
    return _check_name(settings().kernels, f"${ENV_VAR}")


def available_backends(device: Union[str, torch.device] = "cuda") -> tuple[str, ...]:
    """Backends that can reduce tensors on ``device`` here, in auto's order of preference."""
    device = torch.device(device)
    kind = device.type
    if kind == "cuda":
        return tuple(b for b in ("cupy", "numba") if not _cuda_unavailable(b, device.index)) \
            + ("torch",)
    if kind == "cpu":
        return ("torch",) + (("numba",) if _installed("numba") else ())
    return ("torch",)


def backend_for(device: Union[str, torch.device], backend: str | None = None) -> str:
    """The backend reduce_into would use for tensors on ``device`` (same rules, same errors)."""
    return _select(backend, torch.device(device))


def _kinds(dtypes) -> list:
    """The kernel kinds reductions of ``dtypes`` lower to (every op each accepts; bytes-level
    ops may run on any word kind, which depends on the tensors' alignment)."""
    kinds = []
    for dtype in dtypes:
        for op in LOCAL_OPS:
            if dtype in _COMPLEX or dtype not in DTYPES or (op in _BITWISE and
                                                            dtype not in _INTEGRAL):
                continue
            from ._lowering import lower
            kind, _ = lower(dtype, op)
            for one in (("u64", "u32", "u16", "u8") if kind == "bytes" else (kind,)):
                if one not in kinds:
                    kinds.append(one)
    return kinds


_prepared: dict = {}
_prepare_lock = threading.Lock()


def prepare(device: Union[str, torch.device], dtypes: Sequence[torch.dtype] | None = None,
            sources: Sequence[int] = (1,)) -> dict:
    """Probe the kernel backends on ``device`` and compile the kernels reductions there will
    use, now: the runtime calls it when a group is created, on the group's device, so that
    neither the probe nor a compile runs inside the first collective (or on the wrong GPU).

    Idempotent and cached per device (and per dtypes and source counts asked for): a second
    call returns the first one's answer at once. Thread-safe. On a CUDA device the probe of
    each backend runs on that device (not the calling thread's current one); with CuPy chosen,
    the modules of the kinds of ``dtypes`` (default: float32, which the probe compiles anyway)
    for ``sources`` sources per kernel (1: a ring step) are compiled and loaded too; a compile
    error is returned (and logged), not raised: the first reduction would raise it. On any other
    device there is nothing to compile.

    Args:
        device (str or torch.device): e.g. ``"cuda:1"``; ``"cuda"`` means the current device.
        dtypes (sequence of torch.dtype, optional): element types to compile kernels for.
        sources (sequence of int): source counts per kernel to compile (1..8).

    Returns:
        dict: ``device``; ``backend`` (what auto picks there); ``unavailable`` (backend ->
        reason, for the CUDA backends that cannot run there); ``compiled`` (the (kind, sources)
        modules compiled and loaded); ``error`` (a compile error, or None).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available()
                              else 0)
    dtypes = tuple(dtypes) if dtypes is not None else (torch.float32,)
    for dtype in dtypes:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtypes must hold torch.dtype values, got {type(dtype).__name__}")
    sources = tuple(sources)
    if not sources or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 8
                          for n in sources):
        raise ValueError(f"sources must be source counts in 1..8, got {sources!r}")
    key = (str(device), dtypes, sources)
    with _prepare_lock:
        done = _prepared.get(key)
        if done is not None:
            return done
        result = {"device": str(device), "backend": "torch", "unavailable": {},
                  "compiled": [], "error": None}
        if device.type == "cuda":
            for candidate in ("cupy", "numba"):
                reason = _cuda_unavailable(candidate, device.index)
                if reason is not None:
                    result["unavailable"][candidate] = reason
            result["backend"] = _select(None, device)
            if result["backend"] == "cupy":
                from . import _cupy
                try:
                    for kind in _kinds(dtypes):
                        for nsrc in sources:
                            _cupy.load(kind, nsrc, device.index)
                            result["compiled"].append((kind, nsrc))
                except Exception as exc:  # noqa: BLE001 - the first reduction raises it
                    result["error"] = f"{type(exc).__name__}: {exc}"
                    logger.warning("ringcoll.kernels: prepare(%s): %s", device, result["error"])
        else:
            result["backend"] = _select(None, device)
        _prepared[key] = result
        return result


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _check_name(name, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}: unknown kernel backend {name!r}; expected one of {BACKENDS}")
    return name


def _cuda_unavailable(backend: str, index: int | None = None) -> str | None:
    """Why ``backend`` cannot run CUDA kernels on device ``index`` (None: the current device),
    or None when it can (:func:`_probe_backend`, once per backend and device)."""
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return _probe_backend(backend, index)


@lru_cache(maxsize=None)
def _probe_backend(backend: str, device: int) -> str | None:
    """Why ``backend`` cannot run CUDA kernels on cuda:``device``, or None when it can.

    Importing the package and seeing a device is not enough: NVRTC (CuPy) or NVVM/libdevice
    (Numba) may be missing or too old for the driver. So the probe compiles the backend's real
    f32 sum kernels and runs one on five elements of that device, once per process and device
    (CuPy's binary is then in the disk cache); a failure is logged once as a warning and auto
    falls back to the next backend.
    """
    if not _installed(backend):
        return f"the {backend} package is not installed"
    try:
        if backend == "cupy":
            import cupy
            if cupy.cuda.runtime.getDeviceCount() == 0:
                return "CuPy sees no CUDA device"
        else:
            from numba import cuda
            if not cuda.is_available():
                return "numba.cuda.is_available() is False"
    except Exception as exc:  # a driver/runtime mismatch raises from deep inside either package  # noqa: BLE001 - a driver/runtime mismatch raises anything from deep inside
        return f"{backend} cannot use the GPU: {type(exc).__name__}: {exc}"
    try:
        if backend == "cupy":
            from . import _cupy
            _cupy.probe(device)
        else:
            from . import _numba
            _numba.probe(device)
    except Exception as exc:  # noqa: BLE001 - whatever fails, the kernels cannot be used
        first = (str(exc).strip().splitlines() or [""])[0]
        reason = (f"{backend} cannot compile and run its kernels on cuda:{device}: "
                  f"{type(exc).__name__}: {first}")
        logger.warning("ringcoll.kernels: %s", reason)
        return reason
    return None


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        logger.debug(message)


def _select(backend: str | None, device: torch.device) -> str:
    if backend is not None:
        name, where, strict = _check_name(backend, "reduce_into(backend=...)"), "backend=", True
    else:
        where = "set_backend(...)=" if _configured is not None else f"${ENV_VAR}="
        name, strict = get_backend(), False
    if device.type == "cuda":
        if name == "auto":
            for candidate in ("cupy", "numba"):
                reason = _cuda_unavailable(candidate, device.index)
                if reason is None:
                    return candidate
                _log_once(f"auto: no {candidate} kernels for CUDA tensors ({reason}); falling back")
            return "torch"
        if name in ("cupy", "numba"):
            reason = _cuda_unavailable(name, device.index)
            if reason is not None:
                raise RuntimeError(f"{name} kernels were requested ({where}{name}) but {reason}")
        return name
    if name == "cupy" or (name == "numba" and device.type != "cpu"):
        if strict:
            raise ValueError(f"backend={name!r} cannot reduce tensors on {device}: it runs on "
                             f"{'CUDA' if name == 'cupy' else 'CPU and CUDA'} tensors only")
        _log_once(f"{where}{name} does not apply to {device.type} tensors; using torch")
        return "torch"
    if name == "numba" and not _installed("numba"):
        raise RuntimeError(f"numba kernels were requested ({where}numba) but numba is not "
                           f"installed")
    return "torch" if name == "auto" else name


# ---- checks ----

def _check_op_dtype(op, dtype: torch.dtype) -> None:
    if op not in LOCAL_OPS:
        raise ValueError(f"unknown local op {op!r}; expected one of {LOCAL_OPS}")
    if dtype in _COMPLEX:
        if op != "sum":
            raise ValueError(f"op {op!r} is not defined for complex dtype {dtype}; only 'sum' is")
    elif dtype not in DTYPES:
        raise ValueError(f"dtype {dtype} is not supported; expected one of {DTYPES}")
    elif op in _BITWISE and dtype not in _INTEGRAL:
        raise ValueError(f"op {op!r} needs an integer or bool tensor, got dtype {dtype}")


def _check_tensors(dst, sources, out) -> None:
    if not isinstance(dst, torch.Tensor):
        raise TypeError(f"dst must be a torch.Tensor, got {type(dst).__name__}")
    if not dst.is_contiguous():
        raise ValueError("dst must be contiguous")
    named = [(f"src[{i}]", s) for i, s in enumerate(sources)]
    if out is not None:
        named.append(("out", out))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dst.dtype or t.device != dst.device or t.numel() != dst.numel():
            raise ValueError(f"{name} is {t.dtype} x {t.numel()} on {t.device}; expected "
                             f"{dst.dtype} x {dst.numel()} on {dst.device} like dst")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


# ---- the dispatch ----

def reduce_into(dst: torch.Tensor, src: Union[torch.Tensor, Sequence[torch.Tensor]], op: str,
                *, out: torch.Tensor | None = None, backend: str | None = None) -> None:
    """dst = dst (op) src[0] (op) src[1] ... in that order; with ``out``, the result is also
    written into ``out`` (the fused reduce-and-copy of a ring step).

    Every tensor is contiguous, with dst's dtype, device and numel (which may be 0). Half
    precision results are rounded after every step, so every backend gives the bits of torch's
    sequence of in-place ops. Integer sum/product wrap around. On CUDA nothing waits: the
    kernels run on torch's current stream.

    Args:
        dst (Tensor): accumulator, updated in place.
        src (Tensor or sequence of Tensors): the operands, in order (several for a tree node).
        op (str): one of LOCAL_OPS; band/bor/bxor need an integer or bool dtype.
        out (Tensor, optional): also receives the result.
        backend (str, optional): "auto", "cupy", "numba" or "torch" for this call only.

    Example::
        >>> acc, a, b = torch.ones(4), torch.full((4,), 2.0), torch.full((4,), 3.0)
        >>> reduce_into(acc, [a, b], "sum")   # acc is now [6., 6., 6., 6.]
    """
    if isinstance(src, torch.Tensor):
        sources = [src]
    elif isinstance(src, (list, tuple)):
        sources = list(src)
    else:
        raise TypeError(f"src must be a tensor or a list/tuple of tensors, "
                        f"got {type(src).__name__}")
    _check_tensors(dst, sources, out)
    _check_op_dtype(op, dst.dtype)
    name = _select(backend, dst.device)
    if dst.numel() == 0:
        return
    if not sources:
        if out is not None:
            out.copy_(dst)
        return
    if dst.is_complex():  # sum only: the real and imaginary parts add independently
        dst, sources = torch.view_as_real(dst), [torch.view_as_real(s) for s in sources]
        out = None if out is None else torch.view_as_real(out)
    dst, sources = dst.view(-1), [s.view(-1) for s in sources]
    out = None if out is None else out.view(-1)
    if name == "torch":
        apply = _TORCH_INPLACE[op]
        for one in sources:
            apply(dst, one)
        if out is not None:
            out.copy_(dst)
    elif name == "cupy":
        from . import _cupy
        _cupy.reduce_into(dst, sources, op, out)
    elif dst.is_cuda:
        from . import _numba
        _numba.reduce_into_cuda(dst, sources, op, out)
    else:
        from . import _numba
        put = getattr(device_work, "put", None)
        if put is None:
            _numba.reduce_into_cpu(dst, sources, op, out)
        else:                             # compiled now, computed in the stream's order
            put(_numba.cpu_launch(dst, sources, op, out))


#: who runs a computation that is not a torch operation (a numba CPU kernel's): the stream
#: emulator sets ``put`` on a thread while it launches on an emulated stream, where it runs
#: later, in the stream's order (as a CUDA kernel launched from that thread would); else now
device_work = threading.local()



def prepare_reduction(dst: torch.Tensor, src: Union[torch.Tensor, Sequence[torch.Tensor]], op: str,
                      *, out: torch.Tensor | None = None, backend: str | None = None) -> str:
    """The host's part of :func:`reduce_into` on these tensors, now, without reducing: the
    checks, the backend's choice, and its kernel modules compiled and loaded (CuPy: one module
    per source count of each pass; numba: the kind's kernel, compiled for its launches' types
    and, on CUDA, loaded on the tensors' device). The stream-ordered path calls it
    for every reduction of a call before the call's first transfer is posted, so that a
    compile or load that fails leaves no transfer of the call behind. Returns the backend."""
    sources = [src] if isinstance(src, torch.Tensor) else list(src)
    _check_tensors(dst, sources, out)
    _check_op_dtype(op, dst.dtype)
    name = _select(backend, dst.device)
    if dst.numel() == 0 or not sources or name == "torch":
        return name
    if dst.is_complex():
        dst, sources = torch.view_as_real(dst), [torch.view_as_real(s) for s in sources]
        out = None if out is None else torch.view_as_real(out)
    from ._lowering import passes, plan
    kind, lowered, _ = plan(dst.view(-1), [s.view(-1) for s in sources], None if out is None else out.view(-1), op)
    if name == "cupy":
        from . import _cupy
        for chunk, _ in passes(sources):
            _cupy.load(kind, len(chunk), dst.device.index)
    elif dst.is_cuda:
        from . import _numba
        _numba.cuda_compiled(kind, lowered, dst.device.index)
    else:
        from . import _numba
        _numba.cpu_compiled(kind, lowered)
    return name


def scale_(tensor: torch.Tensor, factor) -> None:
    """tensor *= factor (PREMUL_SUM's pre-multiplication, done once per rank); floating point
    (or complex) tensors only, one rounding."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"scale_ (PREMUL_SUM) needs a floating point tensor, got {tensor.dtype}")
    tensor.mul_(factor)


def divide_(tensor: torch.Tensor, divisor: int) -> None:
    """tensor /= divisor (AVG's final division, done once, identically on every rank): true
    division for floating point, truncation toward zero for integers (as NCCL does)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor <= 0:
        raise ValueError(f"divisor must be a positive int (the world size), got {divisor!r}")
    if tensor.dtype == torch.bool:
        raise ValueError("divide_ (AVG) is not defined for bool tensors")
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(divisor)
    else:
        tensor.div_(divisor, rounding_mode="trunc")
