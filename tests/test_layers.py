"""The layers of ringcoll, read from its source: every module is parsed with ``ast``, every
import in it (at the top or inside a function: a late import is still a dependency) becomes an
edge of the import graph, and the graph must go down the layers only, without a circle.

A layer is a package: the folders show the layers. Lowest first (a module may import its own
layer and the ones below it):

0. the models -- ``ops`` (what each ReduceOp means) and ``cost`` (machines and networks: what
   a message, a step and a reduction cost): nothing of ringcoll above them.
1. settings -- ``config`` (every RINGCOLL_* variable, read in one place).
2. algorithms -- ``schedules``: the vocabulary (steps, buffers, layouts), the registry, one
   module per collective, the shared rings, trees and folds.
3. runtime -- ``runtime`` (plan, executor, work, transports, a group's placement) and
   ``kernels`` (the local reductions and their dispatch).
4. selection -- ``selection`` (``auto``: rules, tuning table, model).
5. api -- the drop-ins (``api``), the torch backend and the DDP hook (``backend``).
6. simulation and interop -- ``sim`` (whole calls in one process, the study) and ``msccl``.
7. entry points -- the package itself and the launcher (``cluster``).
8. tools -- ``bench`` (ringcoll-bench), above everything, imported by nothing below.

``EXCEPTIONS`` names, each with its reason, the modules whose layer is not their package's (so
that the list shows where a folder does not yet show its layer); ``layer_of`` reads them first.

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


#: each package (or module) directly under ringcoll -> its layer (see the module docstring); its
#: subpackages and modules share it. One not listed here fails the test.
LAYERS = {
    "ringcoll.ops": 0, "ringcoll.cost": 0,
    "ringcoll.config": 1,
    "ringcoll.schedules": 2,
    "ringcoll.runtime": 3, "ringcoll.kernels": 3,
    "ringcoll.selection": 4,
    "ringcoll.api": 5, "ringcoll.backend": 5,
    "ringcoll.sim": 6, "ringcoll.msccl": 6,
    "ringcoll": 7, "ringcoll.cluster": 7,
    "ringcoll.bench": 8,
}

#: module -> (its layer, why it is not its package's)
EXCEPTIONS = {
    "ringcoll.sim.engine": (3, "the simulator's clock runs plans beside the runtime, and the api prices "
                               "plans with it (api._calls); a package of its own below the api once the "
                               "clock's rewrite into phases (#39 item 2) has landed"),
    "ringcoll.sim.clock": (3, "the event clock in its phases, imported by the engine"),
    "ringcoll.sim.batch": (3, "the clock's compiled one-step exchanges, imported by the engine"),
    "ringcoll.sim._batch_clock": (3, "the compiled clock itself, imported by sim.batch"),
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
    """A module's layer: its entry in EXCEPTIONS, else its nearest listed package's
    (``ringcoll.bench.cli`` is ``ringcoll.bench``'s)."""
    if module in EXCEPTIONS:
        return EXCEPTIONS[module][0]
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


def test_every_package_has_a_layer():
    """Every package and module directly under ringcoll is in LAYERS (the package's own entry,
    not ringcoll's by default), and every exception names a module that exists."""
    graph = import_graph()
    direct = {".".join(module.split(".")[:2]) for module in graph}
    assert not sorted(direct - set(LAYERS)), f"add them to LAYERS: {sorted(direct - set(LAYERS))}"
    assert not sorted(set(EXCEPTIONS) - set(graph)), sorted(set(EXCEPTIONS) - set(graph))


def test_every_exception_is_still_needed():
    """An exception whose module would keep the layers at its package's layer is taken off."""
    graph = import_graph()
    for module in list(EXCEPTIONS):
        kept = EXCEPTIONS.pop(module)
        try:
            upward = upward_edges(graph) - set(DEBT)
        finally:
            EXCEPTIONS[module] = kept
        assert upward, f"{module} keeps the layers at its package's layer: take it off EXCEPTIONS"


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
