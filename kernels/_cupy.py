"""CuPy backend: the kernels of reduce.cu, compiled by NVRTC on first use, one module per kind,
source count and device.

A kernel is specialised on its number of sources (``NSRC``, 1 to MAX_SOURCES, a template
parameter), so that each is sized for its own body; a module holds the kernels of one kind and one
source count (every op, scalar and packed), and is compiled the first time a reduction of that
kind with that many sources runs (a ring step: one source; a tree node: its children), then kept
in memory and in the disk cache of ``_nvrtc``.

The source goes through ringcoll's own NVRTC call (``_nvrtc``, options ``_nvrtc.OPTIONS``), not
through ``cupy.RawModule(code=...)``, whose compiler adds ``-ftz=true`` after the caller's options
(subnormals would be flushed); CuPy loads the binary (``cupy.cuda.function.Module``) and launches.

Tensors are never converted: the kernels receive torch's raw device pointers (zero-copy; bf16 is
just 16-bit words to the kernel) and are launched on torch's current stream of the tensor's
device, so the host never waits.
"""
from __future__ import annotations

import functools
import importlib.resources
import warnings

import numpy as np
import torch

from . import _nvrtc
from ._lowering import (ITEMSIZE, KIND_OPS, MAX_SOURCES, OP_CODE, PACK_BYTES, check_probe,
                        pack_split, passes, plan, probe_data)

THREADS = 256
# Blocks per SM at most: enough resident warps to cover memory latency; the grid-stride loop
# does the rest.
BLOCKS_PER_SM = 16


def pack_width(kind: str) -> int:
    """Elements per 16-byte pack for this kind."""
    return PACK_BYTES // ITEMSIZE[kind]


SOURCE_COUNTS = tuple(range(1, MAX_SOURCES + 1))


def kernel_name(kind: str, op: str, vec: int, nsrc: int) -> str:
    return f"ringcoll::reduce_kernel<ringcoll::{kind}, {OP_CODE[op]}, {vec}, {nsrc}>"


def kernel_names(kind: str, nsrc: int) -> list[str]:
    """The instantiations of reduce_kernel in the module of (kind, nsrc): every op the kind has,
    scalar and packed."""
    if nsrc not in SOURCE_COUNTS:
        raise ValueError(f"nsrc must be in 1..{MAX_SOURCES}, got {nsrc!r}")
    return [kernel_name(kind, op, vec, nsrc) for op in KIND_OPS[kind]
            for vec in (1, pack_width(kind))]


def all_kernel_names(kind: str) -> list[str]:
    """Every instantiation the dispatch can launch for this kind, every source count."""
    return [name for nsrc in SOURCE_COUNTS for name in kernel_names(kind, nsrc)]


def source() -> str:
    return importlib.resources.files(__package__).joinpath("reduce.cu").read_text()


@functools.lru_cache(maxsize=None)
def _arch(device: int) -> str:
    import cupy
    return _nvrtc.arch_option(int(cupy.cuda.Device(device).compute_capability))


def compile_module(kind: str, nsrc: int, arch: str) -> _nvrtc.Compiled:
    """The kernels of one kind and source count, compiled (or read from the disk cache) for
    ``arch``."""
    return _nvrtc.compile_source(source(), kernel_names(kind, nsrc), arch)


@functools.lru_cache(maxsize=None)
def _module(kind: str, nsrc: int, device: int):
    import cupy
    compiled = compile_module(kind, nsrc, _arch(device))
    with cupy.cuda.Device(device):
        module = cupy.cuda.function.Module()
        module.load(compiled.binary)
    return module, compiled.lowered


@functools.lru_cache(maxsize=None)
def _kernel(kind: str, op: str, vec: int, nsrc: int, device: int):
    module, lowered = _module(kind, nsrc, device)
    return module.get_function(lowered[kernel_name(kind, op, vec, nsrc)])


def load(kind: str, nsrc: int, device: int) -> None:
    """Compile (or read from the disk cache) and load the module of (kind, nsrc) on ``device``
    now, as its first reduction would (kernels.prepare)."""
    _module(kind, nsrc, device)


@functools.lru_cache(maxsize=None)
def _max_blocks(device: int) -> int:
    import cupy
    return cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"] * BLOCKS_PER_SM


@functools.lru_cache(maxsize=64)
def _stream(device: int, handle: int):
    import cupy
    with warnings.catch_warnings():
        # CuPy 14 deprecates ExternalStream for Stream.from_external, which older CuPy lacks.
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device)


def probe(device: int) -> None:
    """Compile the (f32, one source) module and run its sum kernel on five elements; raise if
    either fails or the result is wrong (kernels.auto's availability check)."""
    import cupy
    host_dst, host_src, expected = probe_data()
    with cupy.cuda.Device(device):
        kernel = _kernel("f32", "sum", 1, 1, device)
        dst, src = cupy.asarray(host_dst), cupy.asarray(host_src)
        null = np.uint64(0)
        kernel((1,), (32,), (np.uint64(dst.data.ptr), null, np.uint64(src.data.ptr),
                             *[null] * (MAX_SOURCES - 1), np.uint64(dst.size), null))
        check_probe(cupy.asnumpy(dst), expected)


def precompile(device: int = 0, workers: int = 8, kinds=None, counts=SOURCE_COUNTS) -> None:
    """Compile the modules of ``kinds`` (default: every kind) x ``counts`` now, in parallel
    threads (NVRTC runs without the GIL), rather than one at a time at first use."""
    import cupy
    from concurrent.futures import ThreadPoolExecutor

    def build(key):
        kind, nsrc = key
        with cupy.cuda.Device(device):
            _kernel(kind, KIND_OPS[kind][0], 1, nsrc, device)

    keys = [(kind, nsrc) for kind in (kinds or KIND_OPS) for nsrc in counts]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(build, keys))


def reduce_into(dst: torch.Tensor, sources: list[torch.Tensor], op: str,
                out: torch.Tensor | None) -> None:
    """dst = dst (op) sources..., out = dst if given; flat contiguous CUDA tensors, numel > 0."""
    import cupy
    kind, op, n = plan(dst, sources, out, op)
    tensors = [dst, *sources] + ([out] if out is not None else [])
    vec, head = pack_split([t.data_ptr() for t in tensors], ITEMSIZE[kind], n)
    device = dst.device.index
    null = np.uint64(0)
    stream = _stream(device, torch.cuda.current_stream(dst.device).cuda_stream)
    with cupy.cuda.Device(device), stream:
        blocks = max(1, min(-(-launch_items(n, vec, head) // THREADS), _max_blocks(device)))
        for chunk, last in passes(sources):
            kernel = _kernel(kind, op, vec, len(chunk), device)
            pointers = [np.uint64(s.data_ptr()) for s in chunk]
            pointers += [null] * (MAX_SOURCES - len(chunk))
            out_ptr = np.uint64(out.data_ptr()) if (last and out is not None) else null
            kernel((blocks,), (THREADS,), (np.uint64(dst.data_ptr()), out_ptr, *pointers,
                                           np.uint64(n), np.uint64(head)))


def launch_items(n: int, vec: int, head: int) -> int:
    """How many threads have work in the widest of the kernel's three loops (head, packs, tail)."""
    return max(head, (n - head) // vec, (n - head) % vec)
