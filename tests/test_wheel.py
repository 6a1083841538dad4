"""The installed package is the checkout: the wheel is built from the checkout's files, installed
in a fresh virtual environment, and run there.

pyproject.toml maps the top-level kernels/ and bench/ into the package (``ringcoll.kernels``,
``ringcoll.bench``) and lists every subpackage; a folder left out of that list, a .cu file left
out of the package data or a results file swept into the wheel would pass every other test, which
imports from the checkout. Here the wheel is built (offline, with the setuptools at hand) from a
copy of what pyproject.toml builds from, installed with no dependencies into a virtual environment
that reuses this interpreter's site-packages for torch, numpy and numba, and then, from a
directory holding no checkout: ``ringcoll-bench --help`` runs, ``ringcoll.kernels`` reduces with
its CUDA source readable as package data, and every module of the checkout imports from the
wheel's files."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from test_layers import ROOT, module_files

#: what the build reads: the package folders (pyproject.toml's package-dir) and the files named by
#: pyproject.toml itself
BUILT_FROM = ["pyproject.toml", "README.md", "ringcoll_autoload.py"]


def run(command, cwd, timeout=300):
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    shown = " ".join(str(c) for c in command)[:300]
    assert done.returncode == 0, f"{shown}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the venv's python, its scripts folder, a folder with no checkout in it)."""
    pytest.importorskip("setuptools", minversion="64")
    from test_layers import package_dirs

    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    for name in BUILT_FROM:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for folder in {path.relative_to(ROOT).parts[0] for path in package_dirs().values()}:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", base / "dist", source], cwd=base)
    (wheel,) = (base / "dist").glob("ringcoll-*.whl")

    venv = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=base)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = pathlib.Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            cwd=base).strip())
    # torch, numpy, numba from this interpreter (after the venv's own site-packages)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "reuse_test_interpreter.pth").write_text("\n".join(sorted(ours)) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], cwd=base)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return wheel, python, python.parent, elsewhere


def test_the_wheel_holds_the_package_and_nothing_beside_it(installed):
    wheel = installed[0]
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"ringcoll", "ringcoll_autoload.py"}, top
    assert "ringcoll/kernels/reduce.cu" in names and "ringcoll/bench/cli.py" in names
    assert "ringcoll/selection/rules.toml" in names
    assert not [n for n in names if "/results/" in n or n.startswith(("tests/", "tools/", "experiments/"))]
    want = {str(path.relative_to(ROOT)) for path in module_files().values()}
    wheel_py = {name for name in names if name.endswith(".py") and name.startswith("ringcoll/")}
    mapped = {"ringcoll/kernels/": "kernels/", "ringcoll/bench/": "bench/"}
    as_checkout = set()
    for name in wheel_py:
        for inside, folder in mapped.items():
            if name.startswith(inside):
                name = folder + name[len(inside):]
                break
        as_checkout.add(name)
    assert as_checkout == want, (sorted(want - as_checkout), sorted(as_checkout - want))


def test_ringcoll_bench_runs_from_the_installed_wheel(installed):
    _, _, scripts, elsewhere = installed
    script = scripts / ("ringcoll-bench.exe" if os.name == "nt" else "ringcoll-bench")
    printed = run([script, "--help"], cwd=elsewhere)
    assert "usage: ringcoll-bench" in printed and "--collective" in printed


def test_every_module_and_the_kernels_import_from_the_installed_wheel(installed):
    _, python, _, elsewhere = installed
    modules = sorted(name for name in module_files() if not name.endswith("__main__"))
    code = f"""
import importlib, importlib.resources, json, torch
import ringcoll.kernels as kernels
files = {{name: importlib.import_module(name).__file__ for name in {modules!r}}}
dst = torch.arange(5, dtype=torch.int64)
kernels.reduce_into(dst, [torch.arange(5, dtype=torch.int64) * 10], "sum")
cu = importlib.resources.files("ringcoll.kernels").joinpath("reduce.cu").read_text()
print(json.dumps({{"files": files, "sum": dst.tolist(), "cu": len(cu)}}))
"""
    out = json.loads(run([python, "-c", code], cwd=elsewhere).splitlines()[-1])
    assert out["sum"] == [0, 11, 22, 33, 44]
    assert out["cu"] == len((ROOT / "kernels" / "reduce.cu").read_text())
    venv = python.parent.parent.resolve()
    outside = {name: path for name, path in out["files"].items() if venv not in pathlib.Path(path).resolve().parents}
    assert not outside, f"imported from outside the installed wheel: {outside}"
