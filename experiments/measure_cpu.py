"""Measure the CPU backends of reduce_into: torch in-place ops against the Numba kernels.

    python -m experiments.measure_cpu [--numel N] [--reps R]

For each case (sources, fused) it times, interleaved round by round so that load from other
processes hits every contender alike: torch (the in-place op sequence of the torch backend),
numba (the serial kernel the numba backend runs), and numba-parallel (the same generated body
with ``prange`` and ``parallel=True``, kept only for this comparison). It prints the median and
the minimum per call in ms, the effective bandwidth of the median counting every byte a one-pass
kernel must move ((sources + 1) reads + 1 write, + 1 write when fused), and the first-call
(compile) time of each Numba kernel. Results feed MEASUREMENTS.md and the CPU rule of "auto".
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from ringcoll.kernels import _numba, reduce_into


def _parallel_kernel(kind: str, op: str):
    import numba
    source = _numba.kernel_source("cpu", kind, op).replace("range(", "numba.prange(")
    namespace = {"np": np, "numba": numba, **_numba._cpu_helpers()}
    exec(compile(source, "<measure parallel>", "exec"), namespace)
    return numba.njit(nogil=True, parallel=True)(namespace[f"reduce_{kind}_{op}"])


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=16 << 20)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    kind = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16",
            torch.float16: "f16"}[dtype]
    print(f"numel {args.numel} {dtype}, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, {args.reps} interleaved rounds")

    g = torch.Generator().manual_seed(0)
    buffers = [torch.rand(args.numel, generator=g).to(dtype) + 1 for _ in range(4)]
    out = torch.empty_like(buffers[0])
    parallel = _parallel_kernel(kind, "sum")
    as_array = lambda t: _numba._host_array(t, kind)  # noqa: E731

    for name, kernel in (("numba", _numba.cpu_kernel(kind, "sum")), ("numba-parallel", parallel)):
        a = as_array(torch.ones(8, dtype=dtype))
        seconds = _timed(lambda: kernel(a, a, *[a] * 8, 1, False))
        print(f"first call (compile) {name}: {seconds:.2f} s")

    print(f"{'case':<18}{'torch ms':>18}{'numba ms':>18}{'numba-par ms':>18}"
          f"{'torch GB/s':>12}{'numba GB/s':>12}")
    for nsrc, fused in ((1, False), (1, True), (3, False), (3, True)):
        dst, sources = buffers[0], buffers[1:1 + nsrc]
        target = out if fused else None
        contenders = {
            "torch": lambda: reduce_into(dst, sources, "sum", out=target, backend="torch"),
            "numba": lambda: reduce_into(dst, sources, "sum", out=target, backend="numba"),
            "numba-par": lambda: _numba.launch(parallel, as_array(dst),
                                               [as_array(s) for s in sources],
                                               None if target is None else as_array(target)),
        }
        times = {name: [] for name in contenders}
        for fn in contenders.values():
            fn()
        for _ in range(args.reps):
            for name, fn in contenders.items():
                times[name].append(_timed(fn))
        moved = (nsrc + 2 + fused) * dst.numel() * dst.element_size()
        cells = [f"{statistics.median(t) * 1e3:8.2f} ({min(t) * 1e3:6.2f})" for t in times.values()]
        rates = [f"{moved / statistics.median(times[n]) / 1e9:12.1f}" for n in ("torch", "numba")]
        label = f"{nsrc}-ary" + (" fused" if fused else "")
        print(f"{label:<18}" + "".join(f"{c:>18}" for c in cells) + "".join(rates))


if __name__ == "__main__":
    main()
