"""The randomized differential tester (tools.fuzz): a seeded sample against the built-ins
on gloo finds nothing wrong, and the tester does find a deliberately broken result."""
from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from ringcoll import kernels
from tools import fuzz

FUZZ_WORLDS = [1, 2, 3, 4]


def sample(seed, count, worlds=FUZZ_WORLDS, max_bytes=64 << 10):
    return [fuzz.draw(seed, index, worlds, max_bytes) for index in range(count)]


def run_on(clusters, trials, fn=fuzz.run_batch):
    tally = fuzz.Tally()
    by_world = {}
    for trial in trials:
        by_world.setdefault(trial.world, []).append(asdict(trial))
    for world, specs in sorted(by_world.items()):
        answers = clusters(world).run(fn, specs)
        for index, spec in enumerate(specs):
            tally.add(spec, [answers[rank][index] for rank in range(world)])
    return tally


def test_trials_are_functions_of_their_id():
    a, b = fuzz.draw(5, 17, FUZZ_WORLDS, 1 << 20), fuzz.draw(5, 17, FUZZ_WORLDS, 1 << 20)
    assert a == b
    drawn = sample(5, 400, worlds=list(range(1, 9)), max_bytes=1 << 20)
    assert len({asdict(t)["id"] for t in drawn}) == 400
    # the space is covered: every collective, dtype, edge size, sub-groups, async, strided, in place
    assert {t.collective for t in drawn} == set(fuzz.COLLECTIVES)
    assert {t.dtype for t in drawn} == set(fuzz.DTYPES)
    numels = {t.numel for t in drawn}
    assert 0 in numels and 1 in numels and max(numels) > 20000
    assert any(t.members for t in drawn) and any(t.async_op for t in drawn)
    assert any(not t.contiguous for t in drawn) and any(t.in_place for t in drawn)
    assert any(t.algorithm == "auto" for t in drawn) and {t.world for t in drawn} == set(range(1, 9))
    assert any(t.counts and len({c for row in t.counts for c in row}) > 1 for t in drawn)   # uneven all_to_all


def test_seeded_sample_against_the_builtins(clusters):
    trials = sample(2026, 120)
    tally = run_on(clusters, trials)
    assert tally.trials == 120 and tally.checked_elements > 10000
    assert not tally.failing, tally.failing[:3]
    assert tally.by_reference.get("built-in", 0) > 60 and tally.by_reference.get("local", 0) > 5


def test_seeded_sample_on_the_simulator():
    trials = sample(7, 80, worlds=[1, 2, 3, 5, 8], max_bytes=16 << 10)
    tally = fuzz.simulate_trials(trials, progress=None)
    assert tally.trials == 80 and not tally.failing, tally.failing[:3]


def _off_by_one(original):
    def broken(dst, src, op, *, out=None, backend=None):
        original(dst, src, op, out=out, backend=backend)
        if dst.numel() and dst.dtype != torch.bool:
            dst.view(-1)[-1] += 1
            if out is not None:
                out.view(-1)[-1] += 1
    return broken


def test_a_broken_reduction_is_caught_on_the_simulator(monkeypatch):
    monkeypatch.setattr(kernels, "reduce_into", _off_by_one(kernels.reduce_into))
    trials = [t for t in sample(11, 120, worlds=[3, 4], max_bytes=4 << 10)
              if t.collective in ("all_reduce", "reduce_scatter_single") and t.numel > 1 and t.dtype != "bool"][:8]
    assert len(trials) >= 4
    tally = fuzz.simulate_trials(trials, progress=None)
    assert tally.wrong_elements > 0
    assert {f["id"] for f in tally.failing} == {t.id for t in trials}        # every one, by its id
    assert all("wrong elements" in "; ".join(f["problems"]) for f in tally.failing)


def broken_batch(specs):
    """run_batch in a rank whose reductions are off by one in their last element."""
    original = kernels.reduce_into
    kernels.reduce_into = _off_by_one(original)
    try:
        return fuzz.run_batch(specs)
    finally:
        kernels.reduce_into = original


def test_a_broken_reduction_is_caught_against_the_builtin(clusters):
    trials = [t for t in sample(12, 300, worlds=[3], max_bytes=4 << 10)
              if t.collective == "all_reduce" and t.numel > 1 and t.dtype != "bool" and not t.members
              and not fuzz.builtin_lacks(t)][:4]
    assert len(trials) == 4
    tally = run_on(clusters, trials, fn=broken_batch)
    assert {f["id"] for f in tally.failing} == {t.id for t in trials}
    assert tally.by_reference == {"built-in": 4}


def test_a_write_outside_the_output_and_an_input_change_are_caught():
    trial = fuzz.Trial("x:1", "all_gather", "ring", "int32", 3, 5, contiguous=False)
    call = fuzz._Call(trial, 0)
    assert all(p.canaries_ok() for p in call.written)
    call.written[1].base[0] = 5                     # before the first output element
    assert not call.written[1].canaries_ok()
    call.written[0].base[fuzz.PAD + 1] = 5          # the gap of a strided output
    assert not call.written[0].canaries_ok()
    call.kept[0].tensor[0] += 1
    assert not torch.equal(call.kept[0].tensor, call.kept_before[0])


@pytest.mark.parametrize("dtype,op,got,want,wrong", [
    ("int32", "SUM", [1, 2, 3], [1, 2, 4], 1),
    ("float32", "AVG", [1.0, 2.0000001], [1.0, 2.0], 0),       # AVG within rounding
    ("float32", "SUM", [1.0, 2.0000002], [1.0, 2.0], 1),       # everything else exact
    ("bool", "BXOR", [True, False], [True, True], 1),
])
def test_count_wrong(dtype, op, got, want, wrong):
    trial = fuzz.Trial("x:2", "all_reduce", "ring", dtype, 2, len(got), op=op)
    d = getattr(torch, dtype)
    assert fuzz.count_wrong([torch.tensor(got, dtype=d)], [torch.tensor(want, dtype=d)], trial)[0] == wrong
