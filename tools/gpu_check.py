#!/usr/bin/env python
"""GPU check: ringcoll's local-reduction kernels and collectives on CUDA tensors, in one run.

    python -m tools.gpu_check --out DIR [--time-limit 450] [--budget 220] [--worlds 2,4]
                              [--backends cupy,numba,torch] [--timeout-per-check 40]
                              [--runtime-budget 180] [--dry-run]

The first thing to run when a GPU is lent (one GPU is enough): its defaults fit 8 minutes on one
H100 with start-up included (``--runtime-budget`` seconds for the runtime checks, then
``--budget`` for the other sections, never past ``--time-limit`` seconds from its start: at that
limit it writes what it has, says so, ends its children and exits, status 3). It prints its
plan before it starts and writes one timestamped JSON (and its text) under ``--out`` after every
section (a killed run still leaves what it had): give the folder the machine hands back
(``--out "$OUT"``).

Works from a plain checkout (the checkout's root is put on ``sys.path``) or after
``pip install -e .``.

Sections, each inside its own share of the budget (a section that would overrun is cut short and
says so). Every section and every backend in it is independent: an error in one backend is
recorded, that backend stops for the section, the others go on; an error in one section does not
stop the next.
1. environment: versions, GPU, NVRTC, which kernel backends pass the availability probe;
1b. runtime: the checks of ``tools/gpu_runtime.py`` (kernels.prepare, an NCCL self send/recv
   batch through NcclComm, the "ringcoll" backend at world 1, 2-4 in-process ranks on the GPU
   over a loopback communicator (every all_reduce algorithm, the allocator's safety, µs per
   ring step and host time per call), a call under a side stream, event/poll/future latencies,
   CUDA graph capture refused with CaptureError), each in its own process within
   ``--timeout-per-check``, each recorded as pass, fail or skip with its reason (every one
   skipped, with the reason, without CUDA);
2. correctness: every backend (cupy, numba, torch) on CUDA tensors, every op x dtype, one/several/
   more-than-eight sources, fused out, pointers misaligned alike (scalar head, then packs) and
   differently (scalar path), numel 0; exact data (integers, halves, subnormals) against closed
   form results and random data against torch's rounding, bit for bit;
3. streams: a kernel must run on torch's current stream (a busy side stream then our reduction:
   the result must include the stream's earlier work) and must not block the host;
4. bandwidth: each backend and torch's in-place op at 1 MiB ... 1 GiB, CUDA events, warm-up,
   median, against a device-to-device copy of the same size; bytes counted as the copy's are,
   read + write (x = x + y moves 3x the size, the copy 2x); the CuPy kernels' target is >= 90 %
   of the copy at >= 256 MiB; the Numba kernels (one scalar load per element and source) and
   torch are reported against the copy without a target;
5. collectives: ``ringcoll.all_reduce`` with every algorithm on CUDA tensors, 2-4 ranks sharing
   the GPU over gloo, against ``torch.distributed.all_reduce`` on CPU copies, per kernel backend;
   plus async_op=True followed at once by kernels on the current stream (ordering).

Without CUDA, or with ``--dry-run``, every section runs on CPU tensors at small sizes with the CPU
backends, to exercise the script itself; the report says so.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import pathlib
import platform
import re
import statistics
import sys
import time
import traceback

#: when this process started (the time limit counts from here, torch's import included)
STARTED = time.monotonic()
REPO = pathlib.Path(__file__).resolve().parents[1]


# spawned rank processes import this file as their main module and need the checkout too
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from ringcoll import kernels  # noqa: E402
from tests.kernels.kernel_data import (FLOATS, PAIRS, exact_case, first_difference,  # noqa: E402
                                       random_float_case, subnormal_case)
from tools import gpu_runtime  # noqa: E402

MiB = 1 << 20
TARGET = 0.90
TARGET_BACKENDS = ("cupy",)  # the fast path; see the module docstring for the others


# ---- report and budget ----

class Report:
    def __init__(self, out_dir: pathlib.Path, device_name: str, dry_run: bool):
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        slug = re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") or "unknown"
        out_dir.mkdir(parents=True, exist_ok=True)
        self.json_path = out_dir / f"gpu_check_{stamp}_{slug}.json"
        self.text_path = self.json_path.with_suffix(".txt")
        self.data = {"started": stamp, "device": device_name, "dry_run": dry_run, "sections": {}}
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def section(self, name: str, status: str, seconds: float, result: dict) -> None:
        self.data["sections"][name] = {"status": status, "seconds": round(seconds, 1), **result}
        self.say(f"== {name}: {status.upper()} ({seconds:.1f} s)")
        self.save()

    def save(self) -> None:
        self.json_path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        self.text_path.write_text("\n".join(self.lines) + "\n")


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


class OutOfTime(Exception):
    pass


def check_time(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise OutOfTime(f"time budget spent before {what}")


class Backends:
    """The backends still running in one section: the first error of a backend is recorded
    (and reported), that backend is dropped for the rest of the section, the others go on."""

    def __init__(self, report: Report, names):
        self.report, self.live, self.errors = report, list(names), {}

    def __iter__(self):
        return iter(list(self.live))

    def fail(self, backend: str, exc: BaseException, what: str) -> None:
        text = f"{type(exc).__name__}: {exc}".strip()
        self.errors[backend] = f"{what}: {text}"[:4000]
        self.report.say(f"  ERROR {backend} at {what}: {text[:1500]}")
        self.report.say(f"  ({backend} stops for this section; the other backends go on)")
        if backend in self.live:
            self.live.remove(backend)

    def failures(self) -> list:
        return [f"{b}: {e}" for b, e in self.errors.items()]


def run_section(report: Report, name: str, fn, *args) -> None:
    report.say(f"\n== {name}")
    start = time.monotonic()
    try:
        result = fn(report, *args)
        status = ("failed" if result.get("failures") else
                  "skipped" if result.get("skipped") else "ok")
        if result.get("cut_short"):
            status += " (cut short: time budget)"
    except Exception as exc:  # noqa: BLE001 - one section's failure must not stop the others
        text = traceback.format_exc()
        report.say(text.rstrip())
        result, status = {"error": f"{type(exc).__name__}: {exc}", "traceback": text}, "error"
    report.section(name, status, time.monotonic() - start, result)


# ---- data ----

def on_device(cpu_tensor: torch.Tensor, device: str, offset: int) -> torch.Tensor:
    """A copy on ``device`` starting ``offset`` elements into its allocation (misaligned)."""
    buffer = torch.empty(cpu_tensor.numel() + offset, dtype=cpu_tensor.dtype, device=device)
    view = buffer[offset:]
    view.copy_(cpu_tensor)
    return view


# ---- 1. environment ----

def section_environment(report: Report, ctx: dict) -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "device": ctx["device"],
            "kernel_backend_configured": kernels.get_backend()}
    for package in ("cupy", "numba", "numba_cuda", "numpy"):
        try:
            info[package] = importlib.import_module(package).__version__
        except Exception as exc:  # noqa: BLE001
            info[package] = f"unavailable ({type(exc).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    sm_count=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}")
        info["cuda_backends"] = {b: (kernels._cuda_unavailable(b) or "available")
                                 for b in ("cupy", "numba")}
    try:
        from ringcoll.kernels import _nvrtc
        info["nvrtc"] = {"version": _nvrtc.version(), "library": _nvrtc.library()._name,
                         "options": list(_nvrtc.OPTIONS), "cache": str(_nvrtc.cache_dir())}
    except Exception as exc:  # noqa: BLE001 - the cupy backend's error will say the same
        info["nvrtc"] = f"unavailable ({type(exc).__name__}: {exc})"
    info["backends_checked"] = ctx["backends"]
    info["auto_picks"] = kernels.backend_for(ctx["device"])
    for key, value in info.items():
        report.say(f"  {key}: {value}")
    return info


# ---- 1b. runtime checks (one GPU) ----

def section_runtime(report: Report, ctx: dict) -> dict:
    """tools/gpu_runtime.py's checks; "failures" lists the failed ones, "checks" every one."""
    why_not = ctx.get("why_no_cuda", "no CUDA device")
    checks = gpu_runtime.run_all(ctx["device"] == "cuda", ctx["timeout_per_check"],
                                 ctx["runtime_budget"], say=report.say, why_not=why_not)
    failures = [f"{name}: {r['reason']}"[:2000] for name, r in checks.items()
                if r["status"] == "fail"]
    result = {"checks": checks, "failures": failures,
              "timeout_per_check": ctx["timeout_per_check"]}
    if all(r["status"] == "skip" for r in checks.values()):
        result["skipped"] = why_not
    return result


# ---- 2. correctness ----

# (sources, numel, fused, offset in elements, data): one source, several, eight (one pass),
# nine (two passes); every pointer misaligned alike (an int: head + packs) or differently
# ("mixed": tensor i starts i % 3 elements in, the scalar path); subnormals; big enough for
# many blocks, packs and a tail.
CASES = ((1, 1, False, 0, "exact"), (1, 37, True, 0, "exact"), (3, 1000, False, 1, "exact"),
         (8, 4099, True, 0, "exact"), (9, 37, True, 3, "exact"), (3, 1001, True, "mixed", "exact"),
         (3, 37, True, 1, "subnormal"), (9, 1003, False, 0, "subnormal"),
         (3, (1 << 20) + 3, True, 0, "random"), (2, 777, False, 1, "random"),
         (2, 4099, True, "mixed", "random"))
MAKERS = {"exact": exact_case, "subnormal": subnormal_case, "random": random_float_case}


def correctness_cases(small: bool) -> list:
    """CASES; on the CPU (a dry run) only those below 2000 elements."""
    return list(CASES) if not small else [c for c in CASES if c[1] < 2000]


def offsets(offset, count: int) -> list:
    return [i % 3 if offset == "mixed" else offset for i in range(count)]


def section_correctness(report: Report, ctx: dict) -> dict:
    deadline, device = ctx["deadline"], ctx["device"]
    backends = Backends(report, ctx["backends"])
    cases = correctness_cases(ctx["small"])
    failures, checks, cut = [], 0, False
    seconds, wrong = dict.fromkeys(backends.live, 0.0), dict.fromkeys(backends.live, 0)
    if "cupy" in backends.live:
        start = time.monotonic()
        try:
            from ringcoll.kernels import _cupy
            _cupy.precompile(workers=min(12, os.cpu_count() or 1))
            report.say(f"  cupy: NVRTC compiled every kernel in {time.monotonic() - start:.1f} s")
        except Exception as exc:  # noqa: BLE001 - cupy's problem, not numba's or torch's
            backends.fail("cupy", exc, "precompile")
        seconds["cupy"] += time.monotonic() - start
    for backend in backends:  # numel 0, and no sources with out (a plain copy)
        try:
            for numel in (0, 5):
                dst, out = torch.ones(numel, device=device), torch.zeros(numel, device=device)
                kernels.reduce_into(dst, [] if numel else [dst.clone()], "sum", out=out,
                                    backend=backend)
                if not torch.equal(out.cpu(), torch.ones(numel)):
                    failures.append(f"{backend}: numel={numel} edge case wrong")
        except Exception as exc:  # noqa: BLE001
            backends.fail(backend, exc, "numel 0 / no sources")
    try:
        for dtype, op in PAIRS:
            for nsrc, numel, fused, offset, data in cases:
                if data != "exact" and (dtype not in FLOATS or op not in
                                        ("sum", "product", "min", "max")):
                    continue
                check_time(deadline, f"{dtype} {op} nsrc={nsrc}")
                host_dst, host_sources, expected = MAKERS[data](dtype, op, nsrc, numel)
                places = offsets(offset, nsrc + 2)
                for backend in backends:
                    start = time.monotonic()
                    what = (f"{backend} {dtype} {op} nsrc={nsrc} numel={numel} "
                            f"offset={offset} {data}")
                    try:
                        dst = on_device(host_dst, device, places[0])
                        sources = [on_device(h, device, places[2 + i])
                                   for i, h in enumerate(host_sources)]
                        out = (on_device(torch.zeros_like(host_dst), device, places[1])
                               if fused else None)
                        kernels.reduce_into(dst, sources, op, out=out, backend=backend)
                        got = [("dst", dst.cpu())] + ([("out", out.cpu())] if fused else [])
                    except Exception as exc:  # noqa: BLE001
                        backends.fail(backend, exc, what)
                        continue
                    finally:
                        seconds[backend] += time.monotonic() - start
                    checks += 1
                    for name, tensor in got:
                        problem = first_difference(tensor, expected, bits=data == "random")
                        if problem:
                            wrong[backend] += 1
                            failures.append(f"{what} {name}: {problem}")
    except OutOfTime as exc:
        cut = True
        report.say(f"  cut short: {exc}")
    for backend in seconds:
        state = f"ERROR ({backends.errors[backend][:200]})" if backend in backends.errors else "ran"
        report.say(f"  {backend}: {state}; {wrong[backend]} wrong; {seconds[backend]:.1f} s "
                   f"(includes compiling every kernel)")
    for line in failures[:30]:
        report.say(f"  FAIL {line}")
    failures = backends.failures() + failures
    return {"checks": checks, "failures": failures[:200], "cut_short": cut,
            "per_backend": {b: {"wrong": wrong[b], "seconds": round(seconds[b], 1),
                                "error": backends.errors.get(b)} for b in seconds}}


# ---- 3. streams ----

def section_streams(report: Report, ctx: dict) -> dict:
    if ctx["device"] != "cuda":
        report.say("  skipped: needs CUDA (no CUDA device or --dry-run)")
        return {"skipped": "no CUDA"}
    failures, results = [], {}
    backends = Backends(report, ctx["backends"])
    n = 1 << 22
    for backend in backends:
        check_time(ctx["deadline"], f"streams {backend}")
        try:
            results[backend] = stream_order(backend, n)
        except Exception as exc:  # noqa: BLE001 - the next backend still runs
            backends.fail(backend, exc, "streams")
            continue
        ordered, busy = results[backend]["ordered"], results[backend]["host_returned_while_stream_busy"]
        report.say(f"  {backend}: ordered on current stream: {ordered}; returned while the stream "
                   f"was busy: {busy} (host call {results[backend]['host_call_ms']:.3f} ms)")
        if not ordered:
            failures.append(f"{backend}: result does not follow the current stream's earlier work")
        if not busy:
            failures.append(f"{backend}: the host call waited for the GPU (synchronised)")
    return {"backends": results, "failures": backends.failures() + failures}


def stream_order(backend: str, n: int) -> dict:
    """Our reduction queued behind 0.1 s of GPU work on a side stream, a torch kernel after it."""
    dst, src = torch.empty(n, device="cuda"), torch.full((n,), 2.0, device="cuda")
    kernels.reduce_into(dst, src, "sum", backend=backend)  # compile outside the timing
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of everything below
        dst.fill_(1.0)
        start = time.perf_counter()
        kernels.reduce_into(dst, src, "sum", backend=backend)
        host_seconds = time.perf_counter() - start
        after = dst * 10  # a torch kernel right after ours on the same stream
    busy = not side.query()
    torch.cuda.synchronize()
    return {"ordered": bool(torch.all(after == 30.0)), "host_returned_while_stream_busy": busy,
            "host_call_ms": round(host_seconds * 1e3, 3)}


# ---- 4. bandwidth ----

def median_ms(fn, reps: int, device: str) -> float:
    for _ in range(3):
        fn()
    if device != "cuda":
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def section_bandwidth(report: Report, ctx: dict) -> dict:
    device, deadline = ctx["device"], ctx["deadline"]
    contenders = ctx["backends"]
    rows, failures, cut = [], [], False
    report.say("  GB/s count the bytes a one-pass kernel moves (sources and dst read, dst and "
               "out written); torch's n-ary row is n separate in-place ops")
    report.say(f"  target: {', '.join(TARGET_BACKENDS)} >= {100 * TARGET:.0f}% of the copy at "
               f">= 256 MiB; the others are reported without a target")
    report.say(f"  {'case':<28}{'size':>9}{'copy GB/s':>11}" + "".join(
        f"{b + ' GB/s':>13}{'%copy':>7}" for b in contenders))

    backends = Backends(report, contenders)

    def measure(label, dtype, nsrc, fused, size_mib, op="sum"):
        numel = size_mib * MiB // torch.tensor([], dtype=dtype).element_size()
        reps = 50 if size_mib <= 64 else (20 if size_mib <= 256 else 10)
        reps = min(reps, 10) if ctx["small"] else reps
        dst = torch.ones(numel, dtype=dtype, device=device)
        sources = [torch.ones(numel, dtype=dtype, device=device) for _ in range(nsrc)]
        out = torch.empty_like(dst) if fused else None
        copy_ms = median_ms(lambda: dst.copy_(sources[0]), reps, device)  # noqa: F821 - the measure's own tensors, deleted only after the timing
        copy_gbs = 2 * numel * dst.element_size() / copy_ms / 1e6
        moved = (nsrc + 2 + fused) * numel * dst.element_size()  # reads + write (+ out write)
        row = {"case": label, "dtype": str(dtype), "sources": nsrc, "fused": fused,
               "size_mib": size_mib, "copy_gbs": round(copy_gbs, 1)}
        cells = []
        for backend in contenders:
            if backend not in backends.live:
                cells.append(f"{'error':>13}{'':>7}")
                continue
            try:
                ms = median_ms(lambda: kernels.reduce_into(dst, sources, op, out=out,  # noqa: F821 - the measure's own tensors, deleted only after the timing
                                                           backend=backend), reps, device)
            except Exception as exc:  # noqa: BLE001 - the other backends are still measured
                backends.fail(backend, exc, f"{label} {size_mib} MiB")
                cells.append(f"{'error':>13}{'':>7}")
                continue
            gbs = moved / ms / 1e6
            row[backend] = {"ms": round(ms, 4), "gbs": round(gbs, 1),
                            "of_copy": round(gbs / copy_gbs, 3)}
            cells.append(f"{gbs:13.1f}{100 * gbs / copy_gbs:6.0f}%")
        report.say(f"  {label:<28}{size_mib:>6} MiB{copy_gbs:11.1f}" + "".join(cells))
        rows.append(row)
        del dst, sources, out

    plan = bandwidth_plan(ctx["small"])
    for label, dtype, nsrc, fused, size in plan:
        if time.monotonic() > deadline:
            cut = True
            report.say("  (time budget spent: remaining sizes skipped)")
            break
        try:
            measure(label, dtype, nsrc, fused, size)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the copy baseline
            failures.append(f"{label} {size} MiB: {type(exc).__name__}: {exc}"[:2000])
            report.say(f"  {label} {size} MiB: {type(exc).__name__}: {exc}"[:2000])
    if device == "cuda":
        for row in rows:
            if row["size_mib"] >= 256:
                for backend in TARGET_BACKENDS:
                    if backend in row and row[backend]["of_copy"] < TARGET:
                        failures.append(f"{backend} {row['case']} {row['size_mib']} MiB: "
                                        f"{100 * row[backend]['of_copy']:.0f}% of the copy's "
                                        f"bandwidth, target {100 * TARGET:.0f}%")
        torch.cuda.empty_cache()
    for line in failures:
        report.say(f"  BELOW TARGET / FAILED {line}")
    return {"rows": rows, "failures": backends.failures() + failures, "cut_short": cut,
            "target": {"of_copy": TARGET, "backends": list(TARGET_BACKENDS), "min_mib": 256},
            "bytes": "read + write, as the copy: x+=y moves 3x size, the copy 2x"}


def bandwidth_plan(small: bool) -> list:
    """(label, dtype, sources, fused, MiB) rows of the bandwidth section."""
    sizes = [1, 4, 16, 64, 256, 1024] if not small else [1]
    plan = [("f32 x+=y", torch.float32, 1, False, size) for size in sizes]
    big = 256 if not small else 1
    return plan + [("bf16 x+=y", torch.bfloat16, 1, False, big),
                   ("f16 x+=y", torch.float16, 1, False, big),
                   ("f64 x+=y", torch.float64, 1, False, big),
                   ("int8 x+=y", torch.int8, 1, False, big),
                   ("f32 fused x+=y; out=x", torch.float32, 1, True, big),
                   ("f32 3-ary", torch.float32, 3, False, big),
                   ("f32 8-ary", torch.float32, 8, False, big)]


# ---- 5. collectives ----

COLLECTIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8,
                     torch.bool)


def _reference_all_reduce(host: torch.Tensor, op_name: str, world: int, factor: float):
    import torch.distributed as dist
    ref = host.clone() * factor if op_name == "PREMUL_SUM" else host.clone()
    gloo_op = {"PREMUL_SUM": "SUM", "AVG": "SUM"}.get(op_name, op_name)
    dist.all_reduce(ref, op=getattr(dist.ReduceOp, gloo_op))
    if op_name == "AVG":
        kernels.divide_(ref, world)
    return ref


def rank_all_reduce_check(kernel_backend: str, device: str, numel: int, deadline: float,
                          dtypes: tuple = COLLECTIVE_DTYPES) -> dict:
    """On every rank: each all_reduce algorithm, op and dtype, against gloo on CPU copies."""
    import torch.distributed as dist
    import ringcoll

    kernels.set_backend(kernel_backend)
    if device == "cuda":
        torch.cuda.set_device(0)
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = 0.5
    ops = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
           "MAX": dist.ReduceOp.MAX, "BXOR": dist.ReduceOp.BXOR, "AVG": dist.ReduceOp.AVG,
           "PREMUL_SUM": dist._make_nccl_premul_sum(factor)}
    failures, skipped, checks = [], [], 0
    for algorithm in ringcoll.algorithms("all_reduce"):
        for op_name, op in ops.items():
            for dtype in dtypes:
                floating = dtype.is_floating_point
                if (op_name == "BXOR" and floating) or (op_name == "PREMUL_SUM" and not floating) \
                        or (op_name == "AVG" and dtype == torch.bool):
                    continue
                if time.time() > deadline:
                    return {"checks": checks, "failures": failures, "cut_short": True,
                            "skipped": sorted(set(skipped))}
                if op_name == "AVG" and not floating and device == "cpu":
                    continue  # ringcoll, like gloo, averages integers only on CUDA
                # small integers: every order of the reduction gives the same exact result
                base = torch.arange(numel) + rank
                host = ((base % 2 + 1) if op_name == "PRODUCT" else (base % 5 + 1)).to(dtype)
                try:
                    expected = _reference_all_reduce(host, op_name, world, factor)
                except Exception as exc:  # noqa: BLE001 - gloo refuses it alike on every rank
                    skipped.append(f"{op_name} {dtype}: gloo reference raised {exc}"[:200])
                    continue
                tensor = host.to(device)
                try:
                    ringcoll.all_reduce(tensor, op=op, algorithm=algorithm)
                    problem = first_difference(tensor.cpu(), expected)
                except Exception as exc:  # noqa: BLE001 - report, keep going
                    problem = f"raised {type(exc).__name__}: {exc}"
                checks += 1
                if problem:
                    failures.append(f"rank {rank} {algorithm} {op_name} {dtype}: {problem}")
        # async: kernels right before and right after on the current stream
        host = (torch.arange(numel) + rank).float()
        expected = _reference_all_reduce(host, "SUM", world, 1.0) * 2
        tensor = torch.zeros(numel, device=device)
        tensor.add_(host.to(device))
        work = ringcoll.all_reduce(tensor, algorithm=algorithm, async_op=True)
        work.wait()
        tensor.mul_(2)
        checks += 1
        problem = first_difference(tensor.cpu(), expected)
        if problem:
            failures.append(f"rank {rank} {algorithm} async_op ordering: {problem}")
    return {"checks": checks, "failures": failures, "skipped": sorted(set(skipped)),
            "algorithms": ringcoll.algorithms("all_reduce")}


def section_collectives(report: Report, ctx: dict) -> dict:
    try:
        import ringcoll
        launch = ringcoll.launch
        ringcoll.algorithms("all_reduce")
    except Exception as exc:  # noqa: BLE001
        report.say(f"  skipped: ringcoll's launch/all_reduce/algorithms are not importable "
                   f"({type(exc).__name__}: {exc})")
        return {"skipped": f"ringcoll not importable: {exc}"}
    device, failures, runs, cut = ctx["device"], [], [], False
    numel = 1003  # not a multiple of any world size or pack width
    # Without a GPU the CPU Numba kernels would compile in every rank (minutes on 2 cores): the
    # dry run checks the collectives with torch's kernels only.
    backends = collective_backends(ctx)
    for world in ctx["worlds"]:
        cluster = None
        for backend in backends:  # one cluster per world, a fresh one after a lost rank
            if time.monotonic() > ctx["deadline"] - 10:
                cut = True
                break
            # a rank that hangs must not eat the whole budget: bounded per run
            timeout = max(30.0, min(120.0, ctx["deadline"] - time.monotonic()))
            start = time.monotonic()
            try:
                if cluster is None or not cluster.alive:
                    cluster = launch(world, backend="gloo", timeout=timeout)
                wall_deadline = time.time() + (ctx["deadline"] - time.monotonic())
                # the dry run exercises the script: two dtypes are enough there
                dtypes = COLLECTIVE_DTYPES if not ctx["small"] else COLLECTIVE_DTYPES[::3]
                results = cluster.run(rank_all_reduce_check, backend, device, numel,
                                      wall_deadline, dtypes, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - this backend's run is lost, not the next
                failures.append(f"world={world} kernels={backend}: {type(exc).__name__}: "
                                f"{exc}"[:2000])
                report.say(f"  world {world}, kernels {backend}: {type(exc).__name__}: {exc}"[:2000])
                continue
            checks = sum(r["checks"] for r in results)
            wrong = [f for r in results for f in r["failures"]]
            cut = cut or any(r.get("cut_short") for r in results)
            runs.append({"world": world, "kernel_backend": backend, "checks": checks,
                         "wrong": len(wrong), "seconds": round(time.monotonic() - start, 1),
                         "reference_skipped": results[0].get("skipped", [])})
            failures += [f"world={world} kernels={backend} {f}" for f in wrong]
            report.say(f"  world {world}, kernels {backend}: {checks} checks over "
                       f"{results[0].get('algorithms', '?')}, {len(wrong)} wrong "
                       f"({time.monotonic() - start:.1f} s)")
        if cluster is not None:
            cluster.close()
    for line in failures[:30]:
        report.say(f"  FAIL {line}")
    return {"runs": runs, "failures": failures[:200], "cut_short": cut}


def collective_backends(ctx: dict) -> list:
    # Without a GPU the CPU Numba kernels would compile in every rank (minutes on 2 cores): the
    # dry run checks the collectives with torch's kernels only.
    return ctx["backends"] if ctx["device"] == "cuda" else ["torch"]


# ---- main ----

# Each section's share of the budget; its deadline is the start plus the running total of the
# shares, so time a section leaves unused goes to the next.
SHARES = (("correctness", section_correctness, 0.40), ("streams", section_streams, 0.07),
          ("bandwidth", section_bandwidth, 0.25), ("collectives", section_collectives, 0.28))


def default_backends(device: str) -> list:
    """Every installed backend for ``device``, whether or not it passes the availability probe:
    a backend that cannot run is tried and its error reported (the probe's reason is in the
    environment section)."""
    if device == "cuda":
        return [b for b in ("cupy", "numba") if kernels._installed(b)] + ["torch"]
    return list(kernels.available_backends(device))


def plan_lines(ctx: dict, budget_s: float) -> list:
    """What the run will measure, said before it starts."""
    cases = correctness_cases(ctx["small"])
    bandwidth = bandwidth_plan(ctx["small"])
    lines = [f"plan ({budget_s:.0f} s for the sections; device {ctx['device']}; kernel backends "
             f"{', '.join(ctx['backends'])}):",
             "  1. environment: versions, GPU, NVRTC, the availability probe of each backend",
             f"  1b. runtime (at most {ctx['runtime_budget']:.0f} s, {ctx['timeout_per_check']:.0f} s "
             f"per check): {', '.join(gpu_runtime.CHECKS)}"
             + ("" if ctx["device"] == "cuda" else " - all skipped (needs one GPU)")]
    total = 0.0
    for index, (name, _, share) in enumerate(SHARES, start=2):
        total += share
        until = f"until {total * budget_s:.0f} s"
        if name == "correctness":
            what = (f"{len(PAIRS)} (dtype, op) pairs x {len(cases)} cases (exact, subnormal, "
                    f"random floats bit for bit; aligned, misaligned alike, mixed offsets) per "
                    f"backend")
        elif name == "streams":
            what = ("our kernel behind 0.1 s of work on a side stream: ordered, host not blocked"
                    if ctx["device"] == "cuda" else "skipped (needs CUDA)")
        elif name == "bandwidth":
            sizes = sorted({row[4] for row in bandwidth})
            what = (f"{len(bandwidth)} rows at {', '.join(map(str, sizes))} MiB against a copy; "
                    f"target {', '.join(TARGET_BACKENDS)} >= {100 * TARGET:.0f}% at >= 256 MiB")
        else:
            what = (f"all_reduce, every algorithm, op and "
                    f"{len(COLLECTIVE_DTYPES) if not ctx['small'] else 2} dtypes, worlds "
                    f"{', '.join(map(str, ctx['worlds']))} over gloo, kernels "
                    f"{', '.join(collective_backends(ctx))}, against torch.distributed")
        lines.append(f"  {index}. {name} ({until}): {what}")
    return lines


def stop_at_the_limit(report: Report, limit: Budget) -> None:
    """At ``limit``'s deadline, whatever runs: the report says so and is written, child
    processes (a runtime check, the collectives' ranks) are ended, and the process exits with
    status 3 (the machine's own timeout would lose the report's last section)."""
    import multiprocessing
    import threading

    def stop():
        report.say(f"\nTIME LIMIT: stopped {time.monotonic() - STARTED:.0f} s after the start; "
                   f"the sections not marked done above did not finish")
        report.data["time_limit_reached"] = True
        report.save()
        for child in multiprocessing.active_children():
            child.kill()
        for proc in list(gpu_runtime.RUNNING):
            proc.kill()
        os._exit(3)

    timer = threading.Timer(max(limit.left(), 0), stop)
    timer.daemon = True
    timer.start()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results",
                        help="the folder every file of the run is written under")
    parser.add_argument("--time-limit", type=float, default=450.0,
                        help="seconds from the start after which the run writes what it has and "
                             "exits (status 3), whatever is still running")
    parser.add_argument("--budget", type=float, default=220.0,
                        help="seconds for the sections after the runtime checks (cut to what the "
                             "time limit leaves)")
    parser.add_argument("--worlds", default="2,4", help="world sizes for the collectives")
    parser.add_argument("--backends", default=None,
                        help="comma-separated kernel backends to check (default: every installed "
                             "one for the device)")
    parser.add_argument("--timeout-per-check", type=float, default=40.0,
                        help="seconds each runtime check may take in its own process (a hang "
                             "is killed and recorded as a failure)")
    parser.add_argument("--runtime-budget", type=float, default=180.0,
                        help="seconds for all runtime checks together")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU tensors and small sizes, to exercise the script without a GPU")
    args = parser.parse_args(argv)

    limit = Budget(args.time_limit - (time.monotonic() - STARTED))
    cuda = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if cuda else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else "no-gpu-dry-run"
    report = Report(args.out, name, dry_run=not cuda)
    report.say(f"ringcoll GPU check on {name}, budget {args.budget:.0f} s")
    if not cuda:
        why = "--dry-run" if args.dry_run else "no CUDA device"
        report.say(f"({why}: every section runs on CPU tensors at small sizes with the CPU "
                   f"backends; CUDA-only checks are skipped)")
    backends = (args.backends.split(",") if args.backends else default_backends(device))
    for backend in backends:
        kernels._check_name(backend, "--backends")
    ctx = {"device": device, "small": not cuda, "worlds": [int(w) for w in args.worlds.split(",")],
           "backends": backends, "timeout_per_check": args.timeout_per_check,
           "runtime_budget": args.runtime_budget,
           "why_no_cuda": "--dry-run" if args.dry_run else "no CUDA device (torch.cuda."
                                                          "is_available() is False)"}
    plan = plan_lines(ctx, args.budget)
    plan.append(f"  the whole run stops at {args.time_limit:.0f} s from its start (--time-limit)")
    for line in plan:
        report.say(line)
    report.data["plan"] = plan
    stop_at_the_limit(report, limit)

    run_section(report, "environment", section_environment, ctx)
    ctx["runtime_budget"] = min(ctx["runtime_budget"], max(limit.left() - 60, 0))
    run_section(report, "runtime", section_runtime, ctx)
    # the runtime checks had a budget of their own; the sections get theirs, within the limit
    seconds = min(args.budget, max(limit.left() - 10, 0))
    start, total = time.monotonic(), 0.0
    for section, fn, share in SHARES:
        total += share
        ctx["deadline"] = start + total * seconds
        run_section(report, section, fn, ctx)

    statuses = {k: v["status"] for k, v in report.data["sections"].items()}
    report.say("\nsummary: " + ", ".join(f"{k} {v}" for k, v in statuses.items()))
    report.say(f"written: {report.json_path} and {report.text_path.name}")
    report.save()
    return 0 if all(s.startswith(("ok", "skipped")) for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
