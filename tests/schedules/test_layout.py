"""A schedule's layout holds named parameters (ringcoll.schedules.vocabulary: ROOT, SEGMENT,
NODES, ...): a name outside them is an error where the layout is made or read, and ringcoll's
own code names every parameter by its constant."""
import ast
import pathlib

import pytest

from ringcoll.schedules import registry, vocabulary
from ringcoll.schedules.vocabulary import PARAMETERS, SEGMENT, Layout

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("make", [
    lambda: Layout(64, {"segmnet": 4}),                         # made with a misspelt name
    lambda: Layout(64, {SEGMENT: 4}).replace(segmnet=4),        # given one later
    lambda: Layout(64, {SEGMENT: 4}).get("segmnet"),            # read by a schedule
    lambda: Layout(64, {SEGMENT: 4})["segmnet"],
])
def test_a_misspelt_parameter_fails_naming_it_and_the_known_ones(make):
    with pytest.raises(ValueError) as error:
        make()
    message = str(error.value)
    assert "'segmnet'" in message and "'segment'" in message and "'root'" in message, message


def test_the_segment_parameter_is_read_by_its_constant():
    """The same ring all-reduce with and without SEGMENT: 4 segments a chunk against one (a
    misspelt key would have given the second schedule, silently)."""
    ring = registry.get("all_reduce", "ring").schedule
    world, numel = 4, 64
    whole = list(ring(0, world, Layout(numel, {SEGMENT: numel})))
    cut = list(ring(0, world, Layout(numel, {SEGMENT: numel // world // 4})))
    assert len(whole) == 2 * (world - 1), len(whole)
    assert len(cut) > len(whole), (len(cut), len(whole))


def test_every_parameter_has_its_constant():
    constants = {value for name, value in vars(vocabulary).items()
                 if name.isupper() and isinstance(value, str) and not name.startswith("_")}
    assert PARAMETERS <= constants, sorted(PARAMETERS - constants)


def _literal_keys(path: pathlib.Path) -> list:
    """Each place ``path`` names a layout parameter by a string: ``layout["x"]``,
    ``layout.get("x")``, ``Layout(n, {"x": ...})``, ``"x" in layout.params``."""
    found = []

    def is_layout(node):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        return name == "layout"

    def literal(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Subscript) and is_layout(node.value) and literal(node.slice):
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and is_layout(node.func.value) and node.args and literal(node.args[0]):
                found.append((node.lineno, node.args[0].value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Layout" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Dict):
            found += [(node.lineno, key.value) for key in node.args[1].keys if key is not None and literal(key)]
        if isinstance(node, ast.Compare) and literal(node.left) and isinstance(node.comparators[0], ast.Attribute) \
                and node.comparators[0].attr == "params" and is_layout(node.comparators[0].value):
            found.append((node.lineno, node.left.value))
    return found


def test_ringcoll_names_every_layout_parameter_by_its_constant():
    from test_layers import module_files

    literal = {f"{path.relative_to(ROOT)}:{line}": key for path in module_files().values()
               for line, key in _literal_keys(path) if key in PARAMETERS}
    # simulate()'s one read is left to the split of simulate() (a string naming a known
    # parameter still reads it; only a misspelt one fails, at run time)
    literal = {where: key for where, key in literal.items() if not where.startswith("ringcoll/sim/simulate.py")}
    assert not literal, f"layout parameters named by a string, not their constant: {literal}"


def test_the_literal_scan_finds_a_string_key(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('def f(layout):\n    return layout["root"], layout.get("segment"), '
                      'Layout(1, {"nodes": ()}), "in_place" in layout.params\n')
    assert sorted(key for _, key in _literal_keys(source)) == ["in_place", "nodes", "root", "segment"]
