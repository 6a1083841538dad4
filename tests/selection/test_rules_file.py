"""The rules and segment tables are data (ringcoll/selection/rules.toml), read and checked when
ringcoll.selection loads: what each field may say, and that a wheel carries the file."""
from __future__ import annotations

import pytest

from ringcoll.selection import tables


def test_every_rule_reads_back_with_its_condition_and_size(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text('[[rule]]\ncollective = "all_reduce"\nmax_bytes = "64 KiB"\nalgorithm = "ring"\n'
                    'world = "power of two"\nmeasured_upto = 4\nevidence = """\nmeasured\n  here."""\n\n'
                    '[[rule]]\ncollective = "gather"\nalgorithm = "linear"\nworld = "<= 8"\nevidence = "x"\n\n'
                    '[[cuda_segment]]\ncollective = "all_reduce"\nalgorithm = "ring"\nsegment_bytes = "3 MiB"\n'
                    'evidence = "y"\n')
    rules, segments, cuda = tables._load_tables(str(path))
    first, second = rules
    assert (first.collective, first.max_bytes, first.algorithm, first.measured_upto, first.evidence) == \
        ("all_reduce", 64 * 1024, "ring", 4, "measured here.")
    assert [first.admits(w) for w in (1, 2, 3, 4, 6, 8)] == [True, True, False, True, False, True]
    assert second.max_bytes is None and second.measured_upto is None
    assert [second.admits(w) for w in (7, 8, 9)] == [True, True, False]
    assert segments == () and cuda[0].segment_bytes == 3 << 20


@pytest.mark.parametrize("field, value, message", [
    ("world", "even", "world must be"),
    ("world", "< 8", "world must be"),
    ("max_bytes", "64 kB", "a size in rules.toml"),
    ("max_bytes", "lots MiB", "a size in rules.toml"),
])
def test_a_bad_entry_is_refused_when_the_file_is_read(tmp_path, field, value, message):
    path = tmp_path / "rules.toml"
    path.write_text(f'[[rule]]\ncollective = "all_reduce"\nalgorithm = "ring"\nevidence = "x"\n{field} = "{value}"\n')
    with pytest.raises(ValueError, match=message):
        tables._load_tables(str(path))


def test_the_shipped_rules_name_registered_algorithms_and_are_packaged():
    import pathlib
    import tomllib

    from ringcoll.schedules import registry

    for rule in tables.RULES:
        assert rule.algorithm in registry.algorithms(rule.collective), rule
        assert rule.evidence and rule.measured_upto is None or rule.measured_upto >= 2
    for rule in tables.SEGMENTS + tables.CUDA_SEGMENTS:
        assert rule.algorithm in registry.algorithms(rule.collective), rule
    pyproject = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "rules.toml" in pyproject["tool"]["setuptools"]["package-data"]["ringcoll.selection"]
