"""CuPy backend: the kernels of reduce.cu, compiled by NVRTC on first use, one module per kind
and device.

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


def kernel_name(kind: str, op: str, vec: int) -> str:
    return f"ringcoll::reduce_kernel<ringcoll::{kind}, {OP_CODE[op]}, {vec}>"


def kernel_names(kind: str) -> list[str]:
    """Every instantiation of reduce_kernel that the dispatch can launch for this kind."""
    return [kernel_name(kind, op, vec) for op in KIND_OPS[kind] for vec in (1, pack_width(kind))]


def source() -> str:
    return importlib.resources.files(__package__).joinpath("reduce.cu").read_text()


@functools.lru_cache(maxsize=None)
def _arch(device: int) -> str:
    import cupy
    return _nvrtc.arch_option(int(cupy.cuda.Device(device).compute_capability))


def compile_kind(kind: str, arch: str) -> _nvrtc.Compiled:
    """Every kernel of one kind, compiled (or read from the disk cache) for ``arch``."""
    return _nvrtc.compile_source(source(), kernel_names(kind), arch)


@functools.lru_cache(maxsize=None)
def _module(kind: str, device: int):
    import cupy
    compiled = compile_kind(kind, _arch(device))
    with cupy.cuda.Device(device):
        module = cupy.cuda.function.Module()
        module.load(compiled.binary)
    return module, compiled.lowered


@functools.lru_cache(maxsize=None)
def _kernel(kind: str, op: str, vec: int, device: int):
    module, lowered = _module(kind, device)
    return module.get_function(lowered[kernel_name(kind, op, vec)])


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
    """Compile this kind's module (f32) and run its sum kernel on five elements; raise if either
    fails or the result is wrong (kernels.auto's availability check)."""
    import cupy
    host_dst, host_src, expected = probe_data()
    with cupy.cuda.Device(device):
        kernel = _kernel("f32", "sum", 1, device)
        dst, src = cupy.asarray(host_dst), cupy.asarray(host_src)
        null = np.uint64(0)
        kernel((1,), (32,), (np.uint64(dst.data.ptr), null, np.uint64(src.data.ptr),
                             *[null] * (MAX_SOURCES - 1), np.int32(1), np.uint64(dst.size), null))
        check_probe(cupy.asnumpy(dst), expected)


def precompile(device: int = 0, workers: int = 8) -> None:
    """Compile every module now, in parallel threads (NVRTC runs without the GIL), rather than
    one at a time at first use; 92 kernels take NVRTC about a minute on one core."""
    import cupy
    from concurrent.futures import ThreadPoolExecutor

    def build(kind):
        with cupy.cuda.Device(device):
            _kernel(kind, KIND_OPS[kind][0], 1, device)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(build, KIND_OPS))


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
        kernel = _kernel(kind, op, vec, device)
        blocks = max(1, min(-(-launch_items(n, vec, head) // THREADS), _max_blocks(device)))
        for chunk, last in passes(sources):
            pointers = [np.uint64(s.data_ptr()) for s in chunk]
            pointers += [null] * (MAX_SOURCES - len(chunk))
            out_ptr = np.uint64(out.data_ptr()) if (last and out is not None) else null
            kernel((blocks,), (THREADS,), (np.uint64(dst.data_ptr()), out_ptr, *pointers,
                                           np.int32(len(chunk)), np.uint64(n), np.uint64(head)))


def launch_items(n: int, vec: int, head: int) -> int:
    """How many threads have work in the widest of the kernel's three loops (head, packs, tail)."""
    return max(head, (n - head) // vec, (n - head) % vec)
