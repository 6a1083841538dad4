"""ringcoll.kernels: every backend against closed-form results and against torch, for every op
and dtype, on the CPU; the Numba CUDA kernels under the CUDA simulator and through NVVM; the CuPy
sources through nvcc; the selection rules.

Data come from tests/kernels/kernel_data.py (shared with tools/gpu_check.py): exact cases whose
result is known in closed form (integers wrap, float intermediates are exactly representable), and
random floats compared bit for bit with torch's sequence of in-place ops. The slow checks run in
subprocesses started with the module, so they overlap with the in-process tests:
``python tests/kernels/test_kernels.py MODE`` is their entry point.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import ringcoll.kernels as kernels
from ringcoll.kernels import _lowering
from kernel_data import (FLOATS, PAIRS, exact_case, first_difference,
                         random_float_case, subnormal_case)

ROOT = pathlib.Path(__file__).resolve().parents[2]
# (number of sources, numel, fused): one source, several, more than one kernel pass (9 > 8);
# numel not a multiple of any pack width; numel 0 (reduce_into returns before any kernel, the
# simulator launches one anyway).
CASES = ((1, 1, False), (1, 37, True), (3, 100, False), (3, 37, True), (9, 37, True),
         (2, 0, True))


def _exact_cases(dtype, op):
    """(maker, nsrc, numel, fused): the closed-form cases, and for floats subnormal ones too."""
    cases = [(exact_case, nsrc, numel, fused) for nsrc, numel, fused in CASES]
    if dtype in FLOATS and op in ("sum", "product", "min", "max"):
        cases += [(subnormal_case, 3, 37, True), (subnormal_case, 9, 5, False)]
    return cases


def assert_same(got: torch.Tensor, expected: torch.Tensor, what: str, bits: bool = False):
    problem = first_difference(got, expected, bits=bits)
    if problem:
        raise AssertionError(f"{what}: {problem}")


# ---- the slow checks, in subprocesses started with the module ----

class Background:
    """A subprocess whose output goes to files (a pipe nobody reads until the end could fill
    and stall it)."""

    def __init__(self, args: list, env: dict | None = None):
        self.stdout, self.stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(args, stdout=self.stdout, stderr=self.stderr, text=True,
                                     env={**os.environ, **(env or {})}, cwd=ROOT)

    def finish(self, timeout: float = 240) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=timeout)
        self.stdout.seek(0)
        self.stderr.seek(0)
        return code, self.stdout.read(), self.stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _spawn(mode: str, env: dict | None = None) -> Background:
    """This file run as a script in ``mode`` (see the entry points at the end)."""
    return Background([sys.executable, str(pathlib.Path(__file__).resolve()), mode], env)


@pytest.fixture(scope="module", autouse=True)
def background(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")  # empty: NVRTC really compiles
    procs = {"cudasim": _spawn("cudasim", {"NUMBA_ENABLE_CUDASIM": "1"}),
             "numba-ptx": _spawn("numba-ptx", {"NUMBA_ENABLE_CUDASIM": "0"}),
             "nvrtc": _spawn("nvrtc", {"RINGCOLL_KERNEL_CACHE": str(cache)})}
    if shutil.which("nvcc"):
        source = tmp_path_factory.mktemp("nvcc") / "reduce_instances.cu"
        source.write_text(nvcc_instances_source())
        procs["nvcc"] = Background(
            ["nvcc", "-std=c++17", "-cubin", "-arch=sm_90", "-Xcicc", "-O0", "-Xptxas", "-O0",
             "-diag-suppress", "177", "-o", str(source.with_suffix(".cubin")), str(source)])
    yield procs
    for proc in procs.values():
        proc.stop()


def _report(proc: Background) -> dict:
    code, stdout, stderr = proc.finish()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert code == 0 and lines, f"exit {code}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
    return json.loads(lines[-1])


def nvcc_instances_source() -> str:
    """Every kind and op at 1, 2 and 8 sources (NVRTC compiles every source count, in the
    nvrtc check; nvcc's -O0 build of all 736 would take three times as long)."""
    from ringcoll.kernels import _cupy
    names = [name for kind in _lowering.KIND_OPS for nsrc in (1, 2, 8)
             for name in _cupy.kernel_names(kind, nsrc)]
    body = "".join(f"    (void*)&{name},\n" for name in names)
    return (f'#include "{(ROOT / "kernels" / "reduce.cu").as_posix()}"\n'
            f"// Taking each address instantiates the kernel the dispatch can launch.\n"
            f"void* const ringcoll_reduce_instances[] = {{\n{body}}};\n")


# ---- the CPU path: torch and numba, every op x dtype ----

@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("dtype,op", PAIRS + [(torch.complex64, "sum")],
                         ids=lambda v: str(v).replace("torch.", ""))
def test_cpu_exact(backend, dtype, op):
    for maker, nsrc, numel, fused in _exact_cases(dtype, op):
        dst, sources, expected = maker(dtype, op, nsrc, numel)
        out = torch.full_like(dst, 7) if fused else None
        kernels.reduce_into(dst, sources, op, out=out, backend=backend)
        what = f"{backend} {dtype} {op} nsrc={nsrc} numel={numel}"
        assert_same(dst, expected, what)
        if fused:
            assert_same(out, expected, what + " (out)")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
def test_cpu_numba_rounds_like_torch(dtype, op):
    for nsrc, numel, fused in CASES:
        dst, sources, expected = random_float_case(dtype, op, nsrc, numel)
        out = torch.empty_like(dst) if fused else None
        kernels.reduce_into(dst, sources, op, out=out, backend="numba")
        assert_same(dst, expected, f"numba {dtype} {op} nsrc={nsrc} numel={numel}", bits=True)
        if fused:
            assert torch.equal(out, dst)


def test_half_conversions_are_exact_for_every_bit_pattern():
    """The CPU kernels' f16/bf16 conversions against torch on all 65536 encodings, and their
    float32 -> half rounding on values between neighbours (ties included)."""
    import numba
    import numpy as np
    from ringcoll.kernels import _numba

    @numba.njit
    def roundtrip(up, down, bits, floats):
        ups = np.empty(bits.size, np.float32)
        downs = np.empty(floats.size, np.uint16)
        for i in range(bits.size):
            ups[i] = up(bits[i])
        for i in range(floats.size):
            downs[i] = down(floats[i])
        return ups, downs

    bits = np.arange(1 << 16, dtype=np.uint16)
    for dtype, up, down in ((torch.float16, _numba._f16_up, _numba._f16_down),
                            (torch.bfloat16, _numba._bf16_up, _numba._bf16_down)):
        halves = torch.from_numpy(bits.view(np.int16)).view(dtype)
        exact = halves.float()
        # neighbours' midpoints (ties), and points a quarter of the way: exercise rounding
        finite = exact[torch.isfinite(exact)].unique()
        mids = torch.cat([(finite[:-1] + finite[1:]) / 2, finite[:-1] * 0.75 + finite[1:] * 0.25,
                          exact, torch.tensor([1e6, -1e6, 65519.0, 65520.0, 1e-9])])
        mids = mids[torch.isfinite(mids) | torch.isnan(mids)].float()
        ups, downs = roundtrip(numba.njit(up), numba.njit(down), bits, mids.numpy())
        # bit for bit (signed zeros included), NaNs compared as NaNs
        assert_same(torch.from_numpy(ups), exact, f"{dtype} -> float32", bits=True)
        assert_same(torch.from_numpy(downs.view(np.int16)).view(dtype), mids.to(dtype),
                    f"float32 -> {dtype}", bits=True)


def test_numel_zero_and_no_sources():
    for backend in ("torch", "numba"):
        empty = torch.empty(0)
        kernels.reduce_into(empty, [torch.empty(0)], "sum", out=torch.empty(0), backend=backend)
        dst, out = torch.arange(5.0) + 1, torch.zeros(5)
        kernels.reduce_into(dst, [], "max", out=out, backend=backend)
        assert torch.equal(out, torch.arange(5.0) + 1)


def test_closed_form_rank_sum():
    """Rank-valued data, as a collective would see it: sum over 13 ranks is n(n-1)/2."""
    world = 13
    for backend in ("torch", "numba"):
        dst = torch.zeros(33, dtype=torch.int32)
        kernels.reduce_into(dst, [torch.full((33,), r, dtype=torch.int32) for r in range(world)],
                            "sum", backend=backend)
        assert torch.all(dst == world * (world - 1) // 2), backend


def test_source_aliasing_dst_doubles():
    for backend in ("torch", "numba"):
        dst = torch.arange(1, 41, dtype=torch.float32)
        kernels.reduce_into(dst, dst, "sum", backend=backend)
        assert torch.equal(dst, 2 * torch.arange(1, 41, dtype=torch.float32)), backend


def test_word_choice_for_bitwise_ops():
    assert _lowering.word_kind(64, [0, 1024]) == "u64"
    assert _lowering.word_kind(64, [0, 1028]) == "u32"
    assert _lowering.word_kind(6, [0, 16]) == "u16"
    assert _lowering.word_kind(37, [0, 16]) == "u8"
    # an odd offset forces bytes, and the bytes kernel still gives the right answer
    base = torch.arange(1, 66, dtype=torch.uint8)
    dst, src = base[1:].clone(), torch.full((64,), 0x5A, dtype=torch.uint8)
    kernels.reduce_into(dst[1:], src[1:], "bxor", backend="numba")
    assert torch.equal(dst[1:], base[2:] ^ 0x5A)


# ---- AVG and PREMUL_SUM helpers ----

def test_divide_truncates_integers_and_divides_floats():
    ints = torch.tensor([-7, 7, -1, 1, 9], dtype=torch.int32)
    kernels.divide_(ints, 2)
    assert ints.tolist() == [-3, 3, 0, 0, 4]
    floats = torch.tensor([3.0, -1.0], dtype=torch.bfloat16)
    kernels.divide_(floats, 4)
    assert floats.tolist() == [0.75, -0.25]
    with pytest.raises(ValueError, match="bool"):
        kernels.divide_(torch.ones(2, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="divisor"):
        kernels.divide_(torch.ones(2), 0)


def test_scale_multiplies_once():
    t = torch.tensor([1.0, 3.0], dtype=torch.float16)
    kernels.scale_(t, 0.5)
    assert t.tolist() == [0.5, 1.5]
    with pytest.raises(ValueError, match="floating point"):
        kernels.scale_(torch.ones(2, dtype=torch.int64), 2)


# ---- bad input is refused before any tensor is touched ----

@pytest.mark.parametrize("call,error,match", [
    (lambda d: kernels.reduce_into(d, d.clone(), "avg"), ValueError, "unknown local op 'avg'"),
    (lambda d: kernels.reduce_into(d, d.clone(), "band"), ValueError, "integer or bool"),
    (lambda d: kernels.reduce_into(d, d[:3].clone(), "sum"), ValueError, r"src\[0\]"),
    (lambda d: kernels.reduce_into(d, d.double(), "sum"), ValueError, "float64"),
    (lambda d: kernels.reduce_into(d, [d.clone()], "sum", out=d[:2]), ValueError, "out"),
    (lambda d: kernels.reduce_into(d, torch.ones(8, 2)[:, 0], "sum"), ValueError, "contiguous"),
    (lambda d: kernels.reduce_into(d, 3.0, "sum"), TypeError, "src must be"),
    (lambda d: kernels.reduce_into(d, [d.clone(), 1], "sum"), TypeError, r"src\[1\]"),
    (lambda d: kernels.reduce_into(d.numpy(), d, "sum"), TypeError, "dst must be"),
    (lambda d: kernels.reduce_into(d, d.clone(), "sum", backend="gpu"), ValueError, "'gpu'"),
    (lambda d: kernels.reduce_into(d, d.clone(), "sum", backend="cupy"), ValueError, "CUDA"),
    (lambda d: kernels.reduce_into(d.to(torch.uint16), d.to(torch.uint16), "sum"), ValueError,
     "uint16"),
    (lambda d: kernels.reduce_into(d.to(torch.complex64), d.to(torch.complex64), "max"),
     ValueError, "complex"),
])
def test_bad_input(call, error, match):
    dst = torch.arange(1.0, 9.0)
    with pytest.raises(error, match=match):
        call(dst)
    assert torch.equal(dst, torch.arange(1.0, 9.0))


# ---- selection ----

@pytest.fixture
def selection(monkeypatch):
    """Clean global choice, no env var, and a fake of which CUDA backends are usable."""
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    kernels.set_backend(None)
    usable = {"cupy": "CuPy is absent in this test", "numba": "no GPU in this test"}
    monkeypatch.setattr(kernels, "_cuda_unavailable", lambda name, index=None: usable[name])
    monkeypatch.setattr(kernels, "_logged", set())
    yield usable
    kernels.set_backend(None)


def test_auto_on_cpu_is_torch(selection):
    assert kernels.get_backend() == "auto"
    assert kernels.backend_for("cpu") == "torch"


def test_auto_on_cuda_prefers_cupy_then_numba_then_torch(selection, caplog):
    with caplog.at_level(logging.DEBUG, logger="ringcoll.kernels"):
        assert kernels.backend_for("cuda") == "torch"
    assert "no cupy kernels" in caplog.text and "no numba kernels" in caplog.text
    selection["numba"] = None
    assert kernels.backend_for("cuda") == "numba"
    selection["cupy"] = None
    assert kernels.backend_for("cuda") == "cupy"
    assert kernels.available_backends("cuda") == ("cupy", "numba", "torch")


def test_env_var_then_setter_then_per_call(selection, monkeypatch):
    monkeypatch.setenv(kernels.ENV_VAR, "numba")
    assert kernels.get_backend() == "numba" and kernels.backend_for("cpu") == "numba"
    kernels.set_backend("torch")
    assert kernels.backend_for("cpu") == "torch"
    assert kernels.backend_for("cpu", backend="numba") == "numba"
    kernels.set_backend(None)
    assert kernels.backend_for("cpu") == "numba"
    monkeypatch.setenv(kernels.ENV_VAR, "fastest")
    with pytest.raises(ValueError, match="RINGCOLL_KERNELS"):
        kernels.backend_for("cpu")


def test_selection_reaches_the_backend(selection, monkeypatch):
    from ringcoll.kernels import _numba
    calls = []
    monkeypatch.setattr(_numba, "reduce_into_cpu", lambda *args: calls.append(args[2]))
    dst = torch.ones(4)
    monkeypatch.setenv(kernels.ENV_VAR, "numba")
    kernels.reduce_into(dst, torch.ones(4), "max")
    kernels.reduce_into(dst, torch.ones(4), "min", backend="torch")
    assert calls == ["max"]
    kernels.set_backend("torch")
    kernels.reduce_into(dst, torch.ones(4), "sum")
    assert calls == ["max"]


def test_explicit_missing_backend_raises(selection):
    with pytest.raises(RuntimeError, match="cupy kernels were requested .*CuPy is absent"):
        kernels.backend_for("cuda", backend="cupy")
    kernels.set_backend("numba")
    with pytest.raises(RuntimeError, match="numba kernels were requested .*no GPU"):
        kernels.backend_for("cuda")


def test_global_cupy_leaves_cpu_tensors_to_torch(selection, monkeypatch, caplog):
    monkeypatch.setenv(kernels.ENV_VAR, "cupy")
    with caplog.at_level(logging.DEBUG, logger="ringcoll.kernels"):
        assert kernels.backend_for("cpu") == "torch"
    assert "does not apply to cpu" in caplog.text
    with pytest.raises(ValueError, match="CUDA tensors only"):
        kernels.backend_for("cpu", backend="cupy")


def test_set_backend_checks_name_and_package(selection, monkeypatch):
    with pytest.raises(ValueError, match="unknown kernel backend 'nccl'"):
        kernels.set_backend("nccl")
    monkeypatch.setattr(kernels, "_installed", lambda package: package != "cupy")
    with pytest.raises(RuntimeError, match="cupy package is not installed"):
        kernels.set_backend("cupy")
    kernels.set_backend("numba")
    assert kernels.get_backend() == "numba"


def test_cuda_unavailable_reports_a_reason():
    kernels._probe_backend.cache_clear()
    for name in ("cupy", "numba"):
        assert kernels._cuda_unavailable(name) or torch.cuda.is_available()


@pytest.fixture
def probe_env(monkeypatch, caplog):
    """Both packages import and see a device (fakes where there is none), the probes' caches
    are clean before and after."""
    import types
    from numba import cuda
    from ringcoll.kernels import _cupy, _nvrtc
    caches = (kernels._probe_backend, _nvrtc.library, _cupy._arch, _cupy._module,
              _cupy._kernel)
    for cache in caches:
        cache.cache_clear()
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime,
                                                            Device=lambda i: _FakeDevice()))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels, "_installed", lambda package: True)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels, "_logged", set())
    monkeypatch.delenv(kernels.ENV_VAR, raising=False)
    kernels.set_backend(None)
    caplog.set_level(logging.DEBUG, logger="ringcoll.kernels")
    yield caplog
    for cache in caches:
        cache.cache_clear()


def test_probe_falls_back_when_the_kernels_do_not_compile(probe_env, monkeypatch):
    """CuPy imports and sees a GPU but NVRTC cannot be loaded; numba.cuda is available but
    NVVM is missing: auto must not pick either (every reduction would raise), it falls back to
    torch and says why, once, as a warning; an explicit choice raises with the reason."""
    from numba.cuda.cudadrv.error import NvvmSupportError
    from ringcoll.kernels import _numba, _nvrtc
    monkeypatch.setattr(_nvrtc, "_candidates", lambda: ["/nonexistent/libnvrtc.so.13"])

    def no_nvvm(kind, op):
        raise NvvmSupportError("libNVVM cannot be found. Do `conda install cudatoolkit`")

    monkeypatch.setattr(_numba, "cuda_kernel", no_nvvm)
    assert kernels.backend_for("cuda") == "torch"
    cupy_reason = kernels._cuda_unavailable("cupy")
    assert "NVRTCError" in cupy_reason and "libnvrtc" in cupy_reason
    assert "NvvmSupportError" in kernels._cuda_unavailable("numba")
    assert kernels.available_backends("cuda") == ("torch",)
    warnings = [r.getMessage() for r in probe_env.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "cupy cannot compile" in warnings[0]
    assert "numba cannot compile" in warnings[1]
    with pytest.raises(RuntimeError, match="cupy kernels were requested.*NVRTC"):
        kernels.backend_for("cuda", backend="cupy")


def test_numba_cuda_kernels_are_compiled_and_loaded_on_their_device_before_launch(monkeypatch):
    """#37 item 5: cuda_compiled compiles a kernel for its launches' argument types (the types
    test_numba_cuda_kernels_compile_to_ptx compiles through NVVM) and binds it (loads its
    module) with the tensors' device current. Old code: numba.cuda.jit's lazy dispatcher,
    compiled and loaded at the first launch, inside a collective (after the call's first
    transfer: tests/runtime/test_streams.py shows the order through the executor)."""
    import numba
    from numba import cuda
    from ringcoll.kernels import _numba

    events, device = [], []

    class Kernel:
        def bind(self):
            events.append(("bind", device[-1] if device else None))

    class Dispatcher:
        def compile(self, signature):
            events.append(("compile", signature, device[-1] if device else None))
            return Kernel()

    class Gpu:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            device.append(self.index)

        def __exit__(self, *exc):
            device.pop()

    monkeypatch.setattr(cuda, "gpus", type("Gpus", (), {"__getitem__": lambda self, i: Gpu(i)})())
    monkeypatch.setattr(_numba, "cuda_kernel", lambda kind, op: Dispatcher())
    assert isinstance(_numba.cuda_compiled("bf16", "max", 3), Dispatcher)
    assert events == [("compile", _numba.signature("cuda", "bf16"), 3), ("bind", 3)]
    assert str(_numba.signature("cuda", "f16")[0]) == "array(float16, 1d, C)"
    assert str(_numba.signature("cpu", "f16")[0]) == "array(uint16, 1d, C)"
    assert _numba.signature("cuda", "f32")[-2:] == (numba.int64, numba.boolean)


def test_probe_falls_back_on_a_wrong_result(probe_env, monkeypatch):
    """A kernel that compiles and runs but computes garbage (e.g. a stale binary for another
    architecture) is not used either; the next backend that passes is."""
    from ringcoll.kernels import _cupy, _numba

    def garbage(device):
        _numba.check_probe([0.0] * 5, [1.5, 2.5, 3.5, 4.5, 5.5])

    monkeypatch.setattr(_cupy, "probe", garbage)
    monkeypatch.setattr(_numba, "probe", lambda device: None)
    assert kernels.backend_for("cuda") == "numba"
    assert "probe kernel computed" in kernels._cuda_unavailable("cupy")


def test_prepare_probes_and_compiles_on_the_named_device(probe_env, monkeypatch, tmp_path):
    """prepare("cuda:1") probes both backends on device 1 (not the calling thread's device 0),
    compiles with the real NVRTC (cubins for the fake device's sm_90) and loads the modules of
    the dtypes' kinds on device 1; a second call is answered from the cache, another device is
    prepared on its own."""
    from ringcoll.kernels import _cupy, _numba, _nvrtc
    from kernel_data import fake_cupy
    try:
        _nvrtc.library()
    except _nvrtc.NVRTCError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("RINGCOLL_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(kernels, "_prepared", {})
    probed, compiled, loaded, devices = [], [], [], []
    monkeypatch.setattr(_cupy, "probe", lambda device: probed.append(("cupy", device)))
    monkeypatch.setattr(_numba, "probe", lambda device: probed.append(("numba", device)))

    def compile_module(kind, nsrc, arch):
        compiled.append((kind, nsrc, arch))
        return _nvrtc.compile_source(_cupy.source(), _cupy.kernel_names(kind, nsrc), arch)

    def load(binary):
        loaded.append(binary[:4])

    with fake_cupy(monkeypatch, lambda mangled: None, load=load, compile_module=compile_module,
                   devices=devices):
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        first = kernels.prepare("cuda:1", [torch.bfloat16, torch.float32])
        assert first == {"device": "cuda:1", "backend": "cupy", "unavailable": {},
                         "compiled": [("bf16", 1), ("f32", 1)], "error": None}
        assert probed == [("cupy", 1), ("numba", 1)]
        assert compiled == [("bf16", 1, "-arch=sm_90"), ("f32", 1, "-arch=sm_90")]
        assert loaded == [b"\x7fELF"] * 2 and set(devices) == {1}
        assert kernels.prepare(torch.device("cuda", 1), (torch.bfloat16, torch.float32)) is first
        assert len(probed) == 2 and len(compiled) == 2          # nothing ran again
        devices.clear()
        second = kernels.prepare("cuda", [torch.int32], sources=(2,))   # "cuda": the current one
        assert second["device"] == "cuda:0" and probed[2:] == [("cupy", 0), ("numba", 0)]
        # int32 lowers to u32 (sum/product) and i32 (min/max); bitwise ops run on any word
        assert [kind for kind, _ in second["compiled"]] == ["u32", "i32", "u64", "u16", "u8"]
        assert {n for _, n in second["compiled"]} == {2} and set(devices) == {0}


def test_prepare_reports_a_compile_error_and_serves_cpu(probe_env, monkeypatch):
    from ringcoll.kernels import _cupy, _numba
    from kernel_data import fake_cupy
    monkeypatch.setattr(kernels, "_prepared", {})
    monkeypatch.setattr(_cupy, "probe", lambda device: None)
    monkeypatch.setattr(_numba, "probe", lambda device: None)

    def broken(kind, nsrc, arch):
        raise RuntimeError(f"nvrtc refused {kind}")

    with fake_cupy(monkeypatch, lambda mangled: None, compile_module=broken):
        result = kernels.prepare("cuda:0", [torch.float16])
    assert result["backend"] == "cupy" and result["compiled"] == []
    assert result["error"] == "RuntimeError: nvrtc refused f16"
    cpu = kernels.prepare("cpu", [torch.float64])
    assert cpu == {"device": "cpu", "backend": "torch", "unavailable": {}, "compiled": [],
                   "error": None}
    assert kernels.prepare("cpu", [torch.float64]) is cpu
    with pytest.raises(ValueError, match="sources must be source counts in 1..8"):
        kernels.prepare("cpu", sources=(9,))
    with pytest.raises(TypeError, match="torch.dtype"):
        kernels.prepare("cpu", ["float32"])


def test_import_is_cheap():
    code, stdout, stderr = _spawn("import-check").finish()
    assert code == 0, stderr
    assert json.loads(stdout.splitlines()[-1]) == {"numba": False, "cupy": False}


# ---- the CUDA dispatch glue, without a GPU ----

@pytest.fixture
def fake_cupy(monkeypatch):
    """_cupy against a fake CuPy that records module loads and launches (no GPU, no NVRTC: the
    compile step returns each name expression as its own mangled name)."""
    import types
    from ringcoll.kernels import _cupy, _nvrtc
    from kernel_data import fake_cupy
    launches, modules = [], []

    def compile_module(kind, nsrc, arch):
        assert arch == "-arch=sm_90"
        names = _cupy.kernel_names(kind, nsrc)
        return _nvrtc.Compiled(f"binary {kind} {nsrc}".encode(), "", {n: n for n in names}, ())

    def get_function(mangled):
        return lambda grid, block, args: launches.append((mangled, grid, block, args))

    with fake_cupy(monkeypatch, get_function, load=modules.append, stream=7,
                   compile_module=compile_module):
        yield types.SimpleNamespace(launches=launches, modules=modules)


class _FakeDevice:
    compute_capability = "90"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _launch_args(args) -> dict:
    ints = [int(a) for a in args]
    assert len(ints) == 12, ints
    return {"dst": ints[0], "out": ints[1], "sources": ints[2:10], "n": ints[10],
            "head": ints[11]}


def test_cupy_dispatch_launches_the_right_kernels(fake_cupy):
    """Kernel names (each pass's kernel specialised on its own source count), pack width from
    alignment, pointer order, passes of at most 8 sources, out on the last pass only, the grid;
    the module of each (kind, source count) is loaded from our own binary, once."""
    from ringcoll.kernels import _cupy
    launches = fake_cupy.launches
    buffers = torch.zeros(12, 4100)  # rows start 16-byte aligned
    dst, out, sources = buffers[0, :4096], buffers[1, :4096], list(buffers[2:, :4096])
    _cupy.reduce_into(dst, sources, "sum", out)
    (name1, grid1, block1, args1), (name2, _, _, args2) = launches
    assert name1 == "ringcoll::reduce_kernel<ringcoll::f32, 0, 4, 8>"
    assert name2 == "ringcoll::reduce_kernel<ringcoll::f32, 0, 4, 2>"
    assert block1 == (256,) and grid1 == (4,)  # 1024 packs of 4 floats, 256 threads
    first, second = _launch_args(args1), _launch_args(args2)
    assert (first["dst"], first["out"]) == (dst.data_ptr(), 0)
    assert first["sources"] == [t.data_ptr() for t in sources[:8]]
    assert (first["n"], first["head"]) == (4096, 0)
    assert second["out"] == out.data_ptr()
    assert second["sources"] == [sources[8].data_ptr(), sources[9].data_ptr()] + [0] * 6
    launches.clear()
    _cupy.reduce_into(buffers[0, 1:4097], [buffers[2, :4096]], "max", None)  # offsets differ
    assert launches[0][0] == "ringcoll::reduce_kernel<ringcoll::f32, 3, 1, 1>"
    assert launches[0][1] == (16,) and _launch_args(launches[0][3])["head"] == 0
    big = torch.zeros(2, 100000)  # 25000 packs: 98 blocks wanted
    _cupy.reduce_into(big[0], [big[1]], "max", None)
    assert launches[1][1] == (2 * _cupy.BLOCKS_PER_SM,)  # capped: 2 SMs x 16 blocks
    launches.clear()
    flags = torch.zeros(2, 24, dtype=torch.bool)  # row 1 is 8-byte aligned, not 16
    _cupy.reduce_into(flags[0], [flags[1]], "min", None)  # bool min = and on 8-byte words
    assert launches[0][0] == "ringcoll::reduce_kernel<ringcoll::u64, 4, 1, 1>"
    assert launches[0][1] == (1,) and _launch_args(launches[0][3])["n"] == 3
    assert fake_cupy.modules == [b"binary f32 8", b"binary f32 2", b"binary f32 1",
                                 b"binary u64 1"]


def test_cupy_dispatch_keeps_packs_for_a_shared_misalignment(fake_cupy):
    """A world-3 ring chunk of 1003 floats starts 335 elements in (1340 bytes: 12 past a
    boundary) in every buffer: one scalar head element, then packs; out in a buffer of its own
    (aligned) makes the offsets differ and everything scalar."""
    from ringcoll.kernels import _cupy
    launches = fake_cupy.launches
    a, b, c = torch.zeros(1003), torch.zeros(1003), torch.zeros(1003)
    assert {t.data_ptr() % 16 for t in (a, b, c)} == {0}
    dst, src = a[335:669], b[335:669]
    _cupy.reduce_into(dst, [src], "sum", None)
    name, grid, _, args = launches[-1]
    assert name == "ringcoll::reduce_kernel<ringcoll::f32, 0, 4, 1>"
    assert _launch_args(args)["head"] == 1 and _launch_args(args)["n"] == 334
    assert grid == (1,)  # 83 packs, a head of 1 and a tail of 1: one block
    _cupy.reduce_into(dst, [src], "sum", c[:334])
    assert launches[-1][0] == "ringcoll::reduce_kernel<ringcoll::f32, 0, 1, 1>"
    assert _launch_args(launches[-1][3])["head"] == 0


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_pack_split_aligns_every_pointer(itemsize):
    """The head brings every pointer to a 16-byte boundary, is shorter than a pack and never
    longer than the data; differing misalignments (or none shared) give the scalar path."""
    vec = 16 // itemsize
    for offset in range(0, 16, itemsize):
        for n in (0, 1, vec - 1, vec, 3 * vec + 1, 1000):
            pointers = [4096 + offset, 8192 + offset, 65536 + offset]
            got_vec, head = _lowering.pack_split(pointers, itemsize, n)
            assert got_vec == vec and 0 <= head < vec and head <= n
            if head < n:
                assert all((p + head * itemsize) % 16 == 0 for p in pointers), (offset, n)
            # every element is in exactly one of head, whole packs, tail
            packs, tail = divmod(n - head, vec)
            assert head + packs * vec + tail == n and tail < vec
    assert _lowering.pack_split([0, itemsize], itemsize, 100) == (1, 0)
    assert _lowering.pack_split([2, 18], 4, 100) == (1, 0)  # not element-aligned


# ---- results of the background checks (last, so the CPU tests above overlap with them) ----

def test_numba_cuda_kernels_under_simulator(background):
    report = _report(background["cudasim"])
    assert report["failures"] == [], "\n".join(report["failures"][:20])
    assert report["checked"] == sum(len(_exact_cases(d, op)) + 1 for d, op in PAIRS)
    assert report["subnormal_checked"] == 2 * 4 * len(FLOATS)
    assert report["probe"] is None  # the real probe compiled and ran its kernel


def test_cupy_kernels_compile_under_nvrtc_without_ftz(background):
    """reduce.cu through the NVRTC of the nvidia-cuda-nvrtc wheel with _cupy's own options:
    every (kind, op, source count) kernel compiles to PTX for sm_90, and no float instruction of
    any kernel flushes subnormals. The same source with CuPy's RawModule ordering (its -ftz=true
    after ours) does: the check can fail. The modules _cupy loads are cubins, cached on disk."""
    from ringcoll.kernels import _cupy, _nvrtc
    report = _report(background["nvrtc"])
    if report.get("skip"):  # only when the wheel's library cannot be loaded at all
        pytest.skip(report["skip"])
    assert report["arch"] == "-arch=sm_90"
    every = report["every"]
    assert every["options"] == list(_nvrtc.OPTIONS) + ["-arch=compute_90"]
    assert "-ftz=false" in every["options"] and "-ftz=true" not in every["options"]
    expected = sum(len(_cupy.all_kernel_names(kind)) for kind in _lowering.KIND_OPS)
    assert every["entries"] == every["lowered"] == expected == 92 * 8
    assert every["ftz"] == [], every["ftz"]
    assert all(count > 0 for count in every["float_ops"].values()), every["float_ops"]
    for kind, got in report["modules"].items():
        assert got["options"] == list(_nvrtc.OPTIONS) + ["-arch=sm_90"], kind
        assert got["cubin"] and got["cached"], kind
    assert {"add.rn.ftz", "mul.rn.ftz", "setp.lt.ftz"} <= set(report["cupy_order_ftz"])


def test_cupy_kernels_are_specialised_on_their_source_count(background):
    """Each kernel reads exactly its own sources: in the PTX of every (kind, op, vec, nsrc)
    instantiation the source parameters loaded are s0 .. s(nsrc-1), none past them (a runtime
    switch over eight bodies loads all eight in every kernel). And a kernel is sized for its own
    body: ptxas's register count of each packed kernel grows with its sources, and the one-source
    f32 kernel (a ring step) needs at most 32 registers per thread (the switch made it 44)."""
    report = _report(background["nvrtc"])
    if report.get("skip"):
        pytest.skip(report["skip"])
    wrong = report["every"]["sources_read"]
    assert wrong == [], "\n".join(wrong[:20])
    registers = report["registers"]
    for key, by_count in registers.items():
        counts = [by_count[str(n)] for n in (1, 2, 8)]
        assert counts[0] < counts[2] and counts[0] <= counts[1], (key, by_count)
    assert registers["f32 sum packed"]["1"] <= 32, registers["f32 sum packed"]


def test_numba_cuda_kernels_compile_to_ptx(background):
    report = _report(background["numba-ptx"])
    if report.get("skip"):
        pytest.skip(report["skip"])
    assert report["failures"] == [], "\n".join(report["failures"])
    assert report["compiled"] == sum(len(ops) for ops in _lowering.KIND_OPS.values())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: cannot compile "
                    "kernels/reduce.cu here")
def test_cupy_sources_compile_with_nvcc(background):
    code, stdout, stderr = background["nvcc"].finish()
    assert code == 0, (stdout + stderr)[-5000:]


# ---- subprocess entry points ----

def _cudasim_main() -> dict:
    """Every Numba CUDA kernel under NUMBA_ENABLE_CUDASIM=1 on a 2 x 16 grid, against closed-form
    results and, for floats, against torch's rounding."""
    import warnings
    import numpy as np
    from numba import cuda
    from numba import config
    from ringcoll.kernels import _numba
    assert config.ENABLE_CUDASIM, "run with NUMBA_ENABLE_CUDASIM=1"
    warnings.simplefilter("ignore")  # numpy scalar overflow warnings: wrap-around is the point
    failures, checked, subnormal = [], 0, 0
    for dtype, op in PAIRS:
        cases = _exact_cases(dtype, op)
        cases.append((random_float_case if dtype in FLOATS else exact_case, 3, 37, True))
        for maker, nsrc, numel, fused in cases:
            dst, sources, expected = maker(dtype, op, nsrc, numel, seed=1)
            kind, lowered_op, _ = _lowering.plan(dst, sources, None, op)
            np_dtype = _numba.cuda_dtype(kind)
            device = lambda t: cuda.to_device(t.view(torch.uint8).numpy().view(np_dtype))  # noqa
            d_dst = device(dst)
            d_out = device(torch.zeros_like(dst)) if fused else None
            kernel = _numba.cuda_kernel(kind, lowered_op)[2, 16]
            _numba.launch(kernel, d_dst, [device(s) for s in sources], d_out)
            back = lambda d: torch.from_numpy(d.copy_to_host().view(np.uint8)).view(dtype)  # noqa
            what = f"cudasim {dtype} {op} ({kind} {lowered_op}) nsrc={nsrc} numel={numel}"
            checked += 1
            subnormal += maker is subnormal_case
            for name, got in (("dst", back(d_dst)),) + ((("out", back(d_out)),) if fused else ()):
                try:
                    assert_same(got, expected, f"{what} {name}")
                except AssertionError as exc:
                    failures.append(str(exc))
    import ringcoll.kernels
    return {"checked": checked, "subnormal_checked": subnormal,
            "probe": ringcoll.kernels._cuda_unavailable("numba"),
            "failures": failures + _cudasim_dispatch_failures()}


def _cudasim_dispatch_failures() -> list:
    """reduce_into_cuda itself (views, grid, passes) on CPU tensors: the simulator's device
    arrays wrap the tensors' memory, the stream and device hooks are stubbed."""
    import collections
    import contextlib
    import types
    from numba import cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from ringcoll.kernels import _numba
    cuda.as_cuda_array = lambda t: FakeCUDAArray(t.numpy())
    cuda.external_stream = cuda.default_stream = lambda *handle: 0
    cuda.gpus = collections.defaultdict(contextlib.nullcontext)
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)
    _numba._max_blocks = lambda device: 2
    _numba.THREADS = 16
    failures = []
    for dtype, op in PAIRS:
        dst, sources, expected = exact_case(dtype, op, 9, 41, seed=2)
        out = torch.zeros_like(dst)
        _numba.reduce_into_cuda(dst, sources, op, out)
        for name, got in (("dst", dst), ("out", out)):
            try:
                assert_same(got, expected, f"reduce_into_cuda {dtype} {op} {name}")
            except AssertionError as exc:
                failures.append(str(exc))
    return failures


def _numba_ptx_main() -> dict:
    """Compile every Numba CUDA kernel to PTX for sm_90 through NVVM, without a GPU: the real
    compiler catches what the simulator (plain Python) cannot, e.g. unsupported typing."""
    from numba import cuda
    from numba.cuda import dispatcher
    from ringcoll.kernels import _numba

    class _NoGpu:  # device functions ask the current device for its compute capability
        compute_capability = (9, 0)

    dispatcher.get_current_device = lambda: _NoGpu()
    failures, compiled = [], 0
    for kind, ops in _lowering.KIND_OPS.items():
        signature = _numba.signature("cuda", kind)        # what cuda_compiled compiles for
        for op in ops:
            try:
                ptx, _ = cuda.compile_ptx(_numba.cuda_kernel(kind, op).py_func, signature,
                                          cc=(9, 0))
            except Exception as exc:  # noqa: BLE001 - every kernel's failure is collected and reported
                if compiled == 0 and "NVVM" in f"{type(exc).__name__}{exc}":
                    return {"skip": f"NVVM is not available: {exc}"}
                failures.append(f"{kind} {op}: {type(exc).__name__}: {exc}"[:2000])
                continue
            compiled += ".entry" in ptx
    return {"compiled": compiled, "failures": failures}


# PTX float instructions that honour -ftz: arithmetic, min/max, comparisons, conversions.
_FTZ = r"\b(?:add|sub|mul|fma|div|min|max|setp|set|cvt|abs|neg|rcp|sqrt)(?:\.[a-z0-9]+)*\.ftz\b"


def _sources_read(ptx: str, lowered: dict) -> list:
    """For every kernel of ``lowered`` (name -> mangled) whose source parameters (s0..s7: the
    PTX parameters 2..9) loaded in its body are not exactly s0 .. s(nsrc-1): a line saying so."""
    import re
    bodies = dict(re.findall(r"\.entry\s+(\w+)\((.*?)(?=\.entry\s|\Z)", ptx, re.S))
    wrong = []
    for name, mangled in lowered.items():
        nsrc = int(name.rstrip(">").split(",")[-1])
        loaded = {int(j) for j in re.findall(rf"\[{mangled}_param_(\d+)\]", bodies[mangled])}
        sources = sorted(j - 2 for j in loaded if 2 <= j <= 9)
        if sources != list(range(nsrc)):
            wrong.append(f"{name}: reads sources {sources}")
    return wrong


def _nvrtc_main() -> dict:
    """reduce.cu through NVRTC with exactly the options _cupy uses: every instantiation to PTX
    for compute_90 in one program; the cubin modules _cupy loads (sm_90) for a sample; ptxas's
    register counts of the packed kernels at 1, 2 and 8 sources; and f32 once more with
    CuPy's RawModule ordering (its -ftz=true last)."""
    import re
    import time
    from ringcoll.kernels import _cupy, _nvrtc
    try:
        _nvrtc.library()
    except _nvrtc.NVRTCError as exc:
        return {"skip": str(exc)}
    arch = _nvrtc.arch_option(90)
    report = {"version": _nvrtc.version(), "arch": arch, "modules": {}, "registers": {}}
    source = _cupy.source()
    names = [name for kind in _lowering.KIND_OPS for name in _cupy.all_kernel_names(kind)]
    start = time.monotonic()
    every = _nvrtc._compile(source, names, _nvrtc.OPTIONS + ("-arch=compute_90",), "reduce.cu")
    report["every"] = {
        "seconds": round(time.monotonic() - start, 1), "options": list(every.options),
        "entries": every.ptx.count(".entry"), "lowered": len(every.lowered),
        "ftz": sorted(set(re.findall(_FTZ, every.ptx))),
        "float_ops": {op: len(re.findall(rf"\b{op}(?:\.[a-z]+)*\.f(?:32|64)\b", every.ptx))
                      for op in ("add", "mul", "setp")},
        "sources_read": _sources_read(every.ptx, every.lowered)}
    for kind, nsrc in (("f32", 1), ("bf16", 3)):  # what _cupy loads: a cubin, then the cache
        compiled = _cupy.compile_module(kind, nsrc, arch)
        report["modules"][f"{kind} {nsrc}"] = {
            "options": list(compiled.options), "cubin": compiled.binary[:4] == b"\x7fELF",
            "cached": _cupy.compile_module(kind, nsrc, arch) == compiled}
    for kind, op in (("f32", "sum"), ("f16", "max"), ("u8", "bxor"), ("f64", "product")):
        vec = _cupy.pack_width(kind)
        by_count = {n: _cupy.kernel_name(kind, op, vec, n) for n in (1, 2, 8)}
        verbose = _nvrtc._compile(source, list(by_count.values()),
                                  _nvrtc.OPTIONS + (arch, "-Xptxas=-v"), "reduce.cu")
        used = _nvrtc.registers(verbose.log)
        report["registers"][f"{kind} {op} packed"] = {
            n: used[verbose.lowered[name]] for n, name in by_count.items()}
    cupy_order = _nvrtc._compile(source, _cupy.kernel_names("f32", 1),
                                 _nvrtc.OPTIONS + (arch, "-ftz=true"), "reduce.cu")
    report["cupy_order_ftz"] = sorted(set(re.findall(_FTZ, cupy_order.ptx)))
    return report


def _import_check_main() -> dict:
    return {"numba": "numba" in sys.modules, "cupy": "cupy" in sys.modules}


if __name__ == "__main__":
    mode = sys.argv[1]
    main = {"cudasim": _cudasim_main, "numba-ptx": _numba_ptx_main, "nvrtc": _nvrtc_main,
            "import-check": _import_check_main}[mode]
    print(json.dumps(main()))
