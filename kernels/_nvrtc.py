"""NVRTC through ctypes: reduce.cu compiled with ringcoll's options and nobody else's.

Why not ``cupy.RawModule(code=...)``: CuPy 14 appends ``-ftz=true`` to the options of every
module it compiles (``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda``), after the caller's,
and NVRTC takes the last of two ``-ftz`` flags, so a caller's ``-ftz=false`` loses. Flushed
subnormals break the bitwise match with torch (f32/bf16 subnormal sums become 0, min/max compare
them as 0). This module calls NVRTC itself with ``OPTIONS``, caches the binary on disk (one
compile per machine rather than per rank process) and hands back bytes that CuPy's
``cupy.cuda.function.Module.load`` (cuModuleLoadData) loads as they are.

The library is found as CuPy finds it (``cuda.pathfinder``), else in the ``nvidia-cuda-nvrtc``
wheel's folder, else by its usual soname; nothing here needs a GPU, which is how the tests compile
the real kernels on a CPU-only machine.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import pathlib
import pickle
import sys
import tempfile
from dataclasses import dataclass
from typing import Sequence

from ..config import settings

# IEEE behaviour, spelled out: subnormals kept (-ftz=false), no fused multiply-add contraction
# (-fmad=false: every add and mul rounds once, as torch's in-place ops do), IEEE division and
# square root (not used by reduce.cu today; set so that a future op cannot silently differ).
OPTIONS = ("-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false")
CACHE_ENV = "RINGCOLL_KERNEL_CACHE"


class NVRTCError(RuntimeError):
    """NVRTC is missing, or refused the source (the message holds its log)."""


@dataclass(frozen=True)
class Compiled:
    binary: bytes           # a cubin for -arch=sm_XX, NUL-terminated PTX for -arch=compute_XX
    ptx: str                # the PTX, also for a cubin (what the tests inspect)
    lowered: dict           # name expression -> mangled name, for Module.get_function
    options: tuple          # exactly what NVRTC was given
    log: str = ""           # NVRTC's log (ptxas's report with -Xptxas=-v)


# ---- the library ----

_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")


def _candidates() -> list[str]:
    found = []
    try:  # what CuPy 14 itself uses to find NVRTC
        from cuda import pathfinder
        found.append(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    except Exception:  # noqa: BLE001 - not installed, or no NVRTC where it looks
        pass
    for base in sys.path:  # the nvidia-cuda-nvrtc wheels: nvidia/cu13/lib, nvidia/cuda_nvrtc/lib
        for pattern in ("nvidia/cu1*/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
            found += sorted(p for p in glob.glob(os.path.join(base, pattern))
                            if "builtins" not in p and "alt" not in os.path.basename(p))
    return found + list(_SONAMES)


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The NVRTC shared library; NVRTCError naming every place tried when none loads."""
    tried = []
    for candidate in dict.fromkeys(_candidates()):
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as exc:
            tried.append(f"{candidate} ({exc})")
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise NVRTCError("NVRTC (libnvrtc) not found; install the nvidia-cuda-nvrtc wheel or the "
                     "CUDA toolkit. Tried: " + "; ".join(tried))


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def supported_archs() -> tuple[int, ...]:
    """The sm_XX values this NVRTC can emit a cubin for."""
    lib, count = library(), ctypes.c_int()
    _check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * count.value)()
    _check(lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return tuple(archs)


def arch_option(capability: int) -> str:
    """``-arch=sm_XX`` (a cubin, loadable by any driver of this CUDA major: CuPy's choice, see
    its ``_get_arch_for_options_for_nvrtc``) when NVRTC knows the device, else PTX for the newest
    architecture it knows below it (the driver JIT-compiles it)."""
    archs = supported_archs()
    if capability in archs:
        return f"-arch=sm_{capability}"
    older = [a for a in archs if a <= capability]
    if not older:
        raise NVRTCError(f"NVRTC {version()} supports sm_{min(archs)} and up; the device is "
                         f"sm_{capability}")
    return f"-arch=compute_{max(older)}"


def _check(code: int, what: str, log: str = "") -> None:
    if code:
        name = library().nvrtcGetErrorString(code).decode()
        raise NVRTCError(f"{what} failed: {name}" + (f"\n{log}" if log else ""))


# ---- compiling ----

def compile_source(source: str, name_expressions: Sequence[str], arch: str,
                   filename: str = "reduce.cu") -> Compiled:
    """Compile with ``OPTIONS + (arch,)`` and nothing else; cached on disk by content."""
    options = OPTIONS + (arch,)
    key = hashlib.sha256(repr((source, options, tuple(name_expressions), version()))
                         .encode()).hexdigest()
    cached = _cache_load(key)
    if cached is not None:
        return cached
    compiled = _compile(source, name_expressions, options, filename)
    _cache_save(key, compiled)
    return compiled


def _compile(source, name_expressions, options, filename) -> Compiled:
    lib = library()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), filename.encode(), 0,
                                  None, None), "nvrtcCreateProgram")
    try:
        for name in name_expressions:
            _check(lib.nvrtcAddNameExpression(prog, name.encode()), f"nvrtcAddNameExpression {name}")
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        code = lib.nvrtcCompileProgram(prog, len(options), argv)
        _check(code, f"nvrtc compile of {filename} with {' '.join(options)}", _log(lib, prog))
        lowered = {}
        for name in name_expressions:
            mangled = ctypes.c_char_p()
            _check(lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(mangled)),
                   f"nvrtcGetLoweredName {name}")
            lowered[name] = mangled.value.decode()
        ptx = _get(lib, prog, "PTX")
        binary = _get(lib, prog, "CUBIN") if any(o.startswith("-arch=sm_") for o in options) \
            else ptx
        return Compiled(binary, ptx.rstrip(b"\0").decode(), lowered, tuple(options),
                        _log(lib, prog))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def registers(log: str) -> dict:
    """Mangled kernel name -> registers per thread, from a log of a compile with
    ``-Xptxas=-v`` (ptxas's "Compiling entry function ... Used N registers")."""
    found, entry = {}, None
    for line in log.splitlines():
        if "Compiling entry function" in line:
            entry = line.split("'")[1]
        elif entry is not None and "Used " in line and " registers" in line:
            found[entry] = int(line.split("Used ")[1].split()[0])
            entry = None
    return found


def _log(lib, prog) -> str:
    size = ctypes.c_size_t()
    if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) or size.value <= 1:
        return ""
    buffer = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buffer)
    return buffer.value.decode(errors="replace")


def _get(lib, prog, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size)), f"nvrtcGet{what}Size")
    buffer = ctypes.create_string_buffer(size.value)
    _check(getattr(lib, f"nvrtcGet{what}")(prog, buffer), f"nvrtcGet{what}")
    return buffer.raw


# ---- the disk cache: rank processes of one machine compile once ----

def cache_dir() -> pathlib.Path:
    default = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return pathlib.Path(settings().kernel_cache or default / "ringcoll" / "kernels")


def _cache_load(key: str) -> Compiled | None:
    try:
        with open(cache_dir() / f"{key}.pkl", "rb") as f:
            value = pickle.load(f)
        return value if isinstance(value, Compiled) else None
    except Exception:  # noqa: BLE001 - absent, unreadable or stale: compile again
        return None


def _cache_save(key: str, compiled: Compiled) -> None:
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False) as f:
            pickle.dump(compiled, f)
        os.replace(f.name, folder / f"{key}.pkl")  # atomic: ranks may write it at once
    except OSError:
        pass  # a read-only home: every process compiles, slower but correct
