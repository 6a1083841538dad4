"""The layers of ringcoll/, read from its source: every module is parsed with ``ast``, every
import in it (at the top or inside a function: a late import is still a dependency) becomes an
edge of the import graph, and the graph must go down the layers only, without a circle.

The layer order, lowest first (a module may import its own layer and the ones below it):

0. models and vocabulary -- ``ops``, ``machine``, ``schedule`` (steps, buffers, layouts),
   the kernels' lowering and CPU kernels, MSCCL-IR's parser, the simulator's bounds, result
   checks and pictures: nothing of ringcoll above them.
1. settings -- ``config`` (every RINGCOLL_* variable, read in one place), and what only
   needs settings (the NVRTC compiler's cache directory).
2. algorithms -- ``registry``, ``plan``, ``schedules`` (one module per collective, plus the
   shared rings, trees and folds), MSCCL programs turned into schedules and back.
3. runtime -- the kernels' dispatch, ``local`` (a rank's own copies and reductions),
   ``transport``, ``work``, ``executor`` (runs a plan), and the simulator's engine
   (``simulator``: many ranks' plans on a clock beside the runtime).
4. selection -- ``topology`` (the node layout of a group), ``selection`` (rules, tuning
   table, model), the model's fit.
5. api -- the drop-ins (``collectives``), the backend (``backend``) and the DDP hook.
6. simulation front -- ``simulate`` (whole calls in one process), the sweep, MSCCL's
   load/check.
7. entry points -- the package itself, the launcher, the command lines.
8. tools -- ``ringcoll.bench`` (ringcoll-bench), above everything, imported by nothing below.

Nothing under ringcoll/ imports the checkout's ``bench``, ``tools`` or ``experiments``, and
``ringcoll_autoload`` (torch's entry point, above the package) is never imported back.

``DEBT`` lists, each with its reason, the upward edges that remain today and ``CIRCLES`` the
circles inside one layer; the test fails on any edge or circle not listed, and on a listed one
that is gone (so the lists only shrink)."""
import ast
import pathlib
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package_dirs(root: pathlib.Path = ROOT) -> dict:
    """Package name -> its folder, as pyproject.toml maps them (``ringcoll.kernels`` is the
    top-level kernels/, ``ringcoll.bench`` the top-level bench/)."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items()}

#: module -> layer (see the module docstring); a module not listed here fails the test.
LAYERS = {
    "ringcoll.ops": 0, "ringcoll.cost.machine": 0, "ringcoll.cost.network": 0, "ringcoll.schedules.vocabulary": 0,
    "ringcoll.kernels._lowering": 0, "ringcoll.kernels._numba": 0,
    "ringcoll.msccl.ir": 0, "ringcoll.sim": 0, "ringcoll.sim.bounds": 0,
    "ringcoll.sim.pictures": 0, "ringcoll.sim.check": 0, "ringcoll.sim._batch_clock": 0,
    "ringcoll.config": 1, "ringcoll.kernels._nvrtc": 1,
    "ringcoll.schedules.registry": 2, "ringcoll.runtime.plan": 2, "ringcoll.schedules": 2,
    "ringcoll.sim.batch": 2, "ringcoll.msccl.to_schedule": 2, "ringcoll.msccl.mapping": 2, "ringcoll.msccl.export": 2,
    "ringcoll.kernels": 3, "ringcoll.kernels._cupy": 3, "ringcoll.runtime.local": 3, "ringcoll.runtime.transport": 3,
    "ringcoll.runtime": 3, "ringcoll.runtime.work": 3, "ringcoll.runtime.executor": 3, "ringcoll.sim.engine": 3,
    "ringcoll.runtime.stream_runtime": 3, "ringcoll.runtime.transport.stream_ordered": 3, "ringcoll.runtime.watchdog": 3,
    "ringcoll.runtime.nodes": 4, "ringcoll.selection": 4, "ringcoll.sim.fit": 4,
    "ringcoll.api": 5, "ringcoll.backend.hooks": 5, "ringcoll.backend": 5,
    "ringcoll.sim.simulate": 6, "ringcoll.sim.sweep": 6, "ringcoll.sim.trust": 6, "ringcoll.msccl": 6, "ringcoll.msccl.check": 6, "ringcoll.msccl.program": 6,
    "ringcoll": 7, "ringcoll.cluster": 7, "ringcoll.sim.cli": 7, "ringcoll.msccl.__main__": 7,
    "ringcoll.bench": 8,
}

#: what remains to be untangled: (importer, imported) -> why it is there today.
DEBT = {
}

#: circles inside one layer that remain, each cut at one edge here: edge -> why.
CIRCLES = {
}


def module_name(path: pathlib.Path, package: str, folder: pathlib.Path) -> str:
    parts = package.split(".") + list(path.relative_to(folder).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """A module's layer: its own entry, else its nearest listed package's (``ringcoll.bench.cli``
    is ``ringcoll.bench``'s)."""
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise KeyError(f"{module} has no layer in tests/test_layers.py LAYERS: add it")
        name = name.rsplit(".", 1)[0]
    return LAYERS[name]


def imported_names(module: str, path: pathlib.Path, known: set) -> set:
    """Every ringcoll module (or other top-level name) ``module`` imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:None if is_package else -1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            for alias in node.names:
                candidate = f"{prefix}.{alias.name}"
                names.add(candidate if candidate in known else prefix)
    resolved = set()
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        resolved.add(name)
    return resolved - {module}


def module_files(root: pathlib.Path = ROOT) -> dict:
    """Every module of the installed package -> its file in the checkout."""
    files = {}
    for package, folder in package_dirs(root).items():
        for path in folder.rglob("*.py"):
            files.setdefault(module_name(path, package, folder), path)
    return files


def import_graph(root: pathlib.Path = ROOT) -> dict:
    files = module_files(root)
    known = set(files)
    return {module: imported_names(module, path, known) for module, path in files.items()}


def upward_edges(graph: dict) -> set:
    return {(a, b) for a, targets in graph.items() for b in targets
            if b.startswith("ringcoll") and layer_of(b) > layer_of(a)}


def cycles(graph: dict, skip: set) -> list:
    """Each circle of the graph without the ``skip`` edges, as one list of modules."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if target not in graph or (node, target) in skip:
                continue
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_has_a_layer():
    for module in import_graph():
        layer_of(module)


def test_imports_go_down_the_layers_only():
    upward = upward_edges(import_graph())
    new = sorted(upward - set(DEBT))
    assert not new, f"imports from a lower layer to a higher one: {new}"
    gone = sorted(set(DEBT) - upward)
    assert not gone, f"untangled, so take them off DEBT: {gone}"


def test_no_circle():
    graph = import_graph()
    assert cycles(graph, skip=set(DEBT) | set(CIRCLES)) == []
    still = [edge for edge in CIRCLES if cycles(graph, skip=set(DEBT) | set(CIRCLES) - {edge}) == []]
    assert not still, f"no circle left through these, so take them off CIRCLES: {still}"


def test_nothing_imports_the_checkout_or_the_autoloader():
    outside = {"bench", "tools", "experiments", "ringcoll_autoload"}
    bad = sorted((a, b) for a, targets in import_graph().items() for b in targets
                 if b.split(".")[0] in outside)
    assert not bad, bad


def test_only_the_benchmark_imports_the_benchmark():
    bad = sorted((a, b) for a, targets in import_graph().items() for b in targets
                 if b.startswith("ringcoll.bench") and not a.startswith("ringcoll.bench"))
    assert not bad, bad


@pytest.mark.parametrize("source, complaint", [
    ("from .. import simulate\n", "lower layer to a higher"),           # the engine reaching up
    ("import tools.fuzz\n", "tools"),                                   # the checkout's campaigns
    ("from ..bench.cli import main\n", "ringcoll.bench"),                # the library reaching the tool
])
def test_the_checks_catch_a_bad_import(tmp_path, source, complaint):
    """The same checks on a copy of ringcoll/ with one bad import added to the runtime
    (kernels/_cupy.py, ringcoll.kernels._cupy, layer 3): each fails."""
    import shutil

    copy = tmp_path / "checkout"
    for folder in ["ringcoll", "kernels", "bench"]:
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "kernels" / "_cupy.py"
    target.write_text(target.read_text() + "\n\ndef _bad():\n    " + source.replace("\n", "\n    "))
    graph = import_graph(copy)
    upward = upward_edges(graph) - set(DEBT)
    outside = [(a, b) for a, targets in graph.items() for b in targets if b.split(".")[0] in {"tools"}]
    into_bench = [(a, b) for a, targets in graph.items() for b in targets
                  if b.startswith("ringcoll.bench") and not a.startswith("ringcoll.bench")]
    found = {"lower layer to a higher": upward, "tools": outside, "ringcoll.bench": into_bench}[complaint]
    assert found, (source, complaint)
