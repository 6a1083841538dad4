"""The CuPy kernels of kernels/reduce.cu *executed* on the CPU: the CUDA source is compiled by g++
with a few definitions standing in for CUDA's (blockIdx, threadIdx, uint4, __uint_as_float, ...),
and every block and thread of the grid runs in turn. The real dispatch (_cupy.reduce_into: kind
lowering, pack width, scalar head, passes of 8 sources, grid size) launches it on CPU tensors
through a fake CuPy whose kernels are the emulated ones.

What this proves without a GPU: the head / pack / tail index arithmetic covers every element
exactly once (a missed element keeps its old value, a doubled one is reduced twice: both show as
wrong results), every 16-byte pack access is 16-byte aligned (UBSan's alignment check reports
any that is not, and the test fails on it), and every kind but f16 computes torch's bits. f16's conversions are PTX inline
assembly, which a host compiler cannot run: f16 is checked by the NVRTC and nvcc compiles and by
the Numba kernels' reference tests instead. Not proven here: anything about the GPU's memory
system, warps or timing.
"""
from __future__ import annotations

import atexit
import ctypes
import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest
import torch

from ringcoll.kernels import _cupy, _lowering
from kernel_data import (fake_cupy, FLOATS, PAIRS, exact_case, first_difference,
                         random_float_case, subnormal_case)

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Stand-ins for what reduce.cu takes from CUDA; after the standard headers, so that redefining
# the keyword ``asm`` (f16's PTX conversions become no-ops: f16 is not emulated) touches nothing
# else.
_PRELUDE = r"""
#include <cstring>
struct ringcoll_dim3 { unsigned x; };
static ringcoll_dim3 blockIdx, threadIdx, gridDim, blockDim;
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define asm(...) ((void)0)
"""

# One C entry point per kernel instantiation: the whole grid, block by block, thread by thread.
_LAUNCH = r"""
extern "C" void launch_{index}(void* dst, void* out, void* s0, void* s1, void* s2, void* s3,
                               void* s4, void* s5, void* s6, void* s7,
                               unsigned long long n, unsigned long long head, unsigned blocks,
                               unsigned threads) {{
  typedef typename {kind}::S S;
  gridDim.x = blocks;
  blockDim.x = threads;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) {{
      blockIdx.x = b;
      threadIdx.x = t;
      {name}((S*)dst, (S*)out, (const S*)s0, (const S*)s1, (const S*)s2, (const S*)s3,
             (const S*)s4, (const S*)s5, (const S*)s6, (const S*)s7, n, head);
    }}
}}
"""

KINDS = [kind for kind in _lowering.KIND_OPS if kind != "f16"]
# The source counts the cases below launch (9 sources: a pass of 8, then 1); only these are
# built, as a process compiles only the counts it meets.
SOURCE_COUNTS = (1, 2, 3, 8)


def _emulation_source() -> tuple:
    names = [name for kind in KINDS for nsrc in SOURCE_COUNTS
             for name in _cupy.kernel_names(kind, nsrc)]
    parts = [_PRELUDE, f'#include "{(ROOT / "kernels" / "reduce.cu").as_posix()}"\n']
    for index, name in enumerate(names):
        kind = re.match(r"ringcoll::reduce_kernel<(ringcoll::\w+),", name).group(1)
        parts.append(_LAUNCH.format(index=index, kind=kind, name=name))
    return "".join(parts), {name: f"launch_{index}" for index, name in enumerate(names)}


class _Build:
    """g++ started when this module is imported (at collection), so the ~10 s compile overlaps
    with the test files that run before this one; the fixture waits for it."""

    def __init__(self):
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="ringcoll-emulation-"))
        self.proc = None
        compiler = shutil.which("g++")
        if compiler is None:
            return
        source, self.symbols = _emulation_source()
        (self.folder / "emulation.cpp").write_text(source)
        self.library = self.folder / "emulation.so"
        # -O0: the fastest build; UBSan's alignment checks report on stderr and carry on
        self.proc = subprocess.Popen(
            [compiler, "-std=c++17", "-O0", "-shared", "-fPIC", "-w", "-fsanitize=alignment",
             "-o", str(self.library), str(self.folder / "emulation.cpp")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        atexit.register(self.stop)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_BUILD = _Build()


@pytest.fixture(scope="module")
def emulated():
    """name -> the emulated kernel (a ctypes function), and the UBSan log folder."""
    if _BUILD.proc is None:
        pytest.skip("g++ is not on PATH: the CUDA source cannot be built for the host")
    output, _ = _BUILD.proc.communicate(timeout=600)
    assert _BUILD.proc.returncode == 0, output[-5000:]
    lib = ctypes.CDLL(str(_BUILD.library))
    functions = {}
    for name, symbol in _BUILD.symbols.items():
        fn = getattr(lib, symbol)
        fn.argtypes = [ctypes.c_void_p] * 10 + [ctypes.c_ulonglong, ctypes.c_ulonglong,
                                                ctypes.c_uint, ctypes.c_uint]
        fn.restype = None
        functions[name] = fn
    return functions


@pytest.fixture
def cupy_on_cpu(emulated, monkeypatch, capfd):
    """_cupy's dispatch with a fake CuPy whose kernels are the emulated ones; a record of the
    (kernel, head) of each launch. UBSan reports a misaligned access on stderr (file descriptor
    2, once per source location and process) and carries on: captured, it fails the launch."""
    launches = []

    def get_function(name):
        def launch(grid, block, args):
            ints = [int(a) for a in args]
            launches.append((name, ints[11]))
            capfd.readouterr()
            emulated[name](*[p or None for p in ints[:10]], *ints[10:], grid[0], block[0])
            report = capfd.readouterr().err
            assert "runtime error" not in report, f"{name} head={ints[11]}: {report[:2000]}"
        return launch

    with fake_cupy(monkeypatch, get_function):
        yield launches


def placed(host: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy starting ``offset`` elements past a 64-byte-aligned address."""
    buffer = torch.empty(host.numel() + offset + 64, dtype=host.dtype)
    skip = (-buffer.data_ptr() % 64) // host.element_size()
    view = buffer[skip + offset:skip + offset + host.numel()]
    view.copy_(host)
    return view


def _reduce(dtype, op, maker, nsrc, numel, fused, offsets):
    host_dst, host_sources, expected = maker(dtype, op, nsrc, numel, seed=3)
    dst = placed(host_dst, offsets[0])
    out = placed(torch.zeros_like(host_dst), offsets[1]) if fused else None
    sources = [placed(s, offsets[2 + i]) for i, s in enumerate(host_sources)]
    _cupy.reduce_into(dst.view(-1), [s.view(-1) for s in sources], op, out)
    what = f"{dtype} {op} {maker.__name__} nsrc={nsrc} numel={numel} offsets={offsets[:3]}"
    for name, got in (("dst", dst), ("out", out)):
        if got is not None:
            problem = first_difference(got, expected, bits=maker is random_float_case)
            assert problem is None, f"{what} {name}: {problem}"


EMULATED_PAIRS = [(d, op) for d, op in PAIRS if d != torch.float16]


@pytest.mark.parametrize("dtype,op", EMULATED_PAIRS, ids=lambda v: str(v).replace("torch.", ""))
def test_kernels_run_every_case_exactly(cupy_on_cpu, dtype, op):
    """Aligned, misaligned alike (scalar head, then packs), misaligned differently (scalar path);
    sizes around a pack; one source, several, more than one pass; fused out."""
    makers = [exact_case]
    if dtype in FLOATS and op in ("sum", "product", "min", "max"):
        makers += [subnormal_case, random_float_case]
    for maker in makers:
        for nsrc, numel, fused in ((1, 1, True), (3, 37, True), (9, 100, False), (2, 1001, True)):
            for shift in (0, 1, 3):
                _reduce(dtype, op, maker, nsrc, numel, fused, [shift] * (nsrc + 2))
            _reduce(dtype, op, maker, nsrc, numel, fused, [i % 3 for i in range(nsrc + 2)])


def test_a_shared_misalignment_keeps_the_packs(cupy_on_cpu):
    """World-3 ring chunks of an odd-sized float tensor: every pointer 4 bytes past a boundary
    launches the packed kernel with a head of 3, and the result is exact; grid-stride over many
    iterations (2 SMs x 16 blocks of 256 threads for 20011 elements)."""
    launches = cupy_on_cpu
    _reduce(torch.float32, "sum", exact_case, 2, 20011, True, [1] * 4)
    assert launches[-1] == ("ringcoll::reduce_kernel<ringcoll::f32, 0, 4, 2>", 3)
    _reduce(torch.bfloat16, "max", exact_case, 2, 5, False, [7] * 4)  # head covers it all
    assert launches[-1] == ("ringcoll::reduce_kernel<ringcoll::bf16, 3, 8, 2>", 1)
    _reduce(torch.float32, "sum", exact_case, 2, 333, False, [0, 0, 1, 2])
    assert launches[-1] == ("ringcoll::reduce_kernel<ringcoll::f32, 0, 1, 2>", 0)
