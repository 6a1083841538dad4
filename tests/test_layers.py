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
   (``simulator``: many ranks' plans on its event clock, ``sim.clock``, beside the runtime).
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

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ringcoll"

#: module -> layer (see the module docstring); a module not listed here fails the test.
LAYERS = {
    "ringcoll._moved": 0,
    "ringcoll.ops": 0, "ringcoll.sim.machine": 0, "ringcoll.sim.network": 0, "ringcoll.schedules.vocabulary": 0,
    "ringcoll.kernels._lowering": 0, "ringcoll.kernels._numba": 0,
    "ringcoll.msccl.ir": 0, "ringcoll.sim": 0, "ringcoll.sim.bounds": 0,
    "ringcoll.sim.pictures": 0, "ringcoll.sim.check": 0, "ringcoll.sim._batch_clock": 0,
    "ringcoll.config": 1, "ringcoll.kernels._nvrtc": 1,
    "ringcoll.schedules.registry": 2, "ringcoll.runtime.plan": 2, "ringcoll.schedules": 2,
    "ringcoll.sim.batch": 2, "ringcoll.msccl.to_schedule": 2, "ringcoll.msccl.mapping": 2, "ringcoll.msccl.export": 2,
    "ringcoll.kernels": 3, "ringcoll.kernels._cupy": 3, "ringcoll.runtime.local": 3, "ringcoll.runtime.transport": 3,
    "ringcoll.runtime": 3, "ringcoll.runtime.work": 3, "ringcoll.runtime.executor": 3, "ringcoll.sim.engine": 3, "ringcoll.sim.clock": 3,
    "ringcoll.runtime.streams": 3, "ringcoll.runtime.transport.stream": 3, "ringcoll.runtime.watchdog": 3,
    "ringcoll.runtime.nodes": 4, "ringcoll.selection": 4, "ringcoll.sim.fit": 4,
    "ringcoll.api": 5, "ringcoll.backend.hooks": 5, "ringcoll.backend": 5,
    "ringcoll.sim.simulate": 6, "ringcoll.sim.sweep": 6, "ringcoll.sim.trust": 6, "ringcoll.msccl": 6, "ringcoll.msccl.check": 6, "ringcoll.msccl.program": 6,
    "ringcoll": 7, "ringcoll.cluster": 7, "ringcoll.sim.cli": 7, "ringcoll.msccl.__main__": 7,
    "ringcoll.kernels.testing": 7, "ringcoll.kernels.measure_cpu": 7,
    "ringcoll.bench": 8,
}

#: what remains to be untangled: (importer, imported) -> why it is there today.
DEBT = {
}

#: circles inside one layer that remain, each cut at one edge here: edge -> why.
CIRCLES = {
}


def module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
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


def import_graph(package: pathlib.Path = PACKAGE) -> dict:
    files = {module_name(p, package): p for p in package.rglob("*.py")}
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
    (ringcoll/kernels/_cupy.py, layer 3): each fails."""
    import shutil

    copy = tmp_path / "ringcoll"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "kernels" / "_cupy.py"
    target.write_text(target.read_text() + "\n\ndef _bad():\n    " + source.replace("\n", "\n    "))
    graph = import_graph(copy)
    upward = upward_edges(graph) - set(DEBT)
    outside = [(a, b) for a, targets in graph.items() for b in targets if b.split(".")[0] in {"tools"}]
    into_bench = [(a, b) for a, targets in graph.items() for b in targets
                  if b.startswith("ringcoll.bench") and not a.startswith("ringcoll.bench")]
    found = {"lower layer to a higher": upward, "tools": outside, "ringcoll.bench": into_bench}[complaint]
    assert found, (source, complaint)


@pytest.mark.parametrize("old", sorted(__import__("ringcoll._moved", fromlist=["MOVED"]).MOVED))
def test_old_module_paths_still_import_with_a_deprecation(old):
    """A pre-split path (``ringcoll.runtime.executor``, ``ringcoll.schedules.vocabulary``, ...) imports, warns with a
    DeprecationWarning naming the new path, and gives the very module at the new path, not a copy
    (a copy would hold its own registry, plan cache and settings)."""
    import importlib
    import sys
    import warnings

    from ringcoll._moved import MOVED

    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert any(issubclass(w.category, DeprecationWarning) and MOVED[old] in str(w.message) for w in caught)


def test_an_old_child_module_is_the_new_one():
    """``import ringcoll.sim.sweep`` (a child of a moved package) binds the module at
    ``ringcoll.sim.sweep`` itself: the alias finder runs before the path finder, which would
    otherwise load the file a second time under the old name."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("ringcoll.sim.sweep")
        step = importlib.import_module("ringcoll.schedules.vocabulary").Step
    import ringcoll.schedules.vocabulary
    import ringcoll.sim.sweep

    assert old is ringcoll.sim.sweep and step is ringcoll.schedules.vocabulary.Step
    assert old.__spec__.name == "ringcoll.sim.sweep" and ringcoll.sim.__spec__.name == "ringcoll.sim"
