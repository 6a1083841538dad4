"""What the study trusts: a user's algorithm stays out of ``auto`` unless it opts in, and its
declared cost is checked against the simulator's clock at registration; the study CLI's
labels, errors and marks; the lower bound per link level; the fit's warnings; symmetric runs
of Swing and Bine at scale."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import ringcoll
from ringcoll import registry, selection
from _util import one_thread  # noqa: F401 - the simulator runs on one thread

RING = registry.get("all_reduce", "ring")


def ring_copy(rank, world, layout):
    """The ring all-reduce, registered under another name by a 'user' (this module)."""
    yield from RING.schedule(rank, world, layout)


@pytest.fixture
def cleanup():
    names = []
    yield names
    for collective, name in names:
        registry._REGISTRY[collective].pop(name, None)
    registry.version += 1


def test_a_user_algorithm_stays_out_of_auto_and_a_wrong_cost_warns(cleanup):
    def optimistic(world, nbytes, segment=None):
        return ringcoll.Cost(*(x / 100 for x in RING.cost(world, nbytes, segment)))

    cleanup.append(("all_reduce", "test_optimistic"))
    with pytest.warns(UserWarning, match=r"all_reduce/test_optimistic at world 8, 1024 B: declared cost "
                                         r"[0-9.]+ us, the simulator's clock [0-9.]+ us \(0\.01x\)"):
        ringcoll.register("all_reduce", "test_optimistic", cost=optimistic)(ring_copy)
    assert registry.get("all_reduce", "test_optimistic").auto is False
    machine = ringcoll.Machine()
    for nbytes, world in ((1024, 8), (1 << 20, 3)):
        assert selection.choose("all_reduce", "auto", nbytes, world, machine=machine)[0] != "test_optimistic"
    # an honest cost registers silently; auto=True opts in
    cleanup.append(("all_reduce", "test_honest"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ringcoll.register("all_reduce", "test_honest", cost=RING.cost, auto=True)(ring_copy)
    assert registry.get("all_reduce", "test_honest").auto is True


def test_a_schedule_that_cannot_run_at_a_checked_world_is_named(cleanup):
    def only_pof2(rank, world, layout):
        if world & (world - 1):
            raise ValueError(f"needs a power of two, got {world}")
        yield from RING.schedule(rank, world, layout)

    cleanup.append(("all_reduce", "test_pof2"))
    with pytest.warns(UserWarning, match=r"test_pof2 at world 3, 1024 B: could not be simulated \(ValueError: "
                                         r"needs a power of two, got 3\)"):
        ringcoll.register("all_reduce", "test_pof2", cost=RING.cost)(only_pof2)


def test_builtins_keep_their_place_in_auto():
    kept_out = {("broadcast", "bine_near"), ("reduce", "bine_near"), ("all_reduce", "rabenseifner_far")}
    for collective, names in ringcoll.algorithms().items():
        for name in names:
            algorithm = registry.get(collective, name)
            if registry.is_builtin(algorithm.schedule) and not name.startswith("msccl:"):
                assert algorithm.auto == ((collective, name) not in kept_out), (collective, name)
