"""``auto``'s ties and each collective's list follow the ``preference`` every registration
declares (ringcoll.schedules.registry.register), not the order modules were imported in: the
classic algorithms first (0-9), then Swing, Bine, direct, the node-aware and torus ones, PAT,
NCCL's;
a user's algorithm without one after every built-in."""
from __future__ import annotations

import pytest

import ringcoll
from ringcoll import selection
from ringcoll.schedules import registry

#: the bands of register's docstring: name -> the preferences its registrations may take
BANDS = {"swing_latency": range(10, 20), "swing_bandwidth": range(10, 20), "swing_torus_bandwidth": range(10, 20),
         "swing_torus_latency": range(10, 20), "bine": range(20, 30), "bine_near": range(20, 30),
         "direct": range(30, 40), "hierarchical": range(40, 50), "torus2d": range(40, 50),
         "bucket_torus": range(40, 50), "pat": range(50, 60), "nccl_ring": range(60, 70),
         "nccl_tree": range(60, 70), "nccl_pat": range(60, 70)}
CLASSIC = range(0, 10)


@pytest.fixture
def cleanup():
    names = []
    yield names
    for collective, name in names:
        if name in registry.algorithms(collective):
            registry.unregister(collective, name)


def builtins():
    return [registry.get(c, n) for c, names in registry.algorithms().items() for n in names
            if registry.is_builtin(registry.get(c, n).schedule) and not n.startswith("msccl:")]


def test_every_builtin_declares_a_preference_in_its_band():
    wrong = {(a.collective, a.name): a.preference for a in builtins()
             if a.preference not in BANDS.get(a.name, CLASSIC)}
    assert wrong == {}, f"built-in algorithms outside their band (register's docstring): {wrong}"


def test_no_two_builtins_of_a_collective_share_a_preference():
    """So no tie between built-ins is left to their names."""
    for collective in registry.algorithms():
        taken = [a.preference for a in builtins() if a.collective == collective]
        assert len(taken) == len(set(taken)), f"{collective}: preferences {taken}"


def test_each_collective_is_listed_by_preference():
    for collective, names in registry.algorithms().items():
        orders = [registry.get(collective, n).order for n in names]
        assert orders == sorted(orders), f"{collective}: listed {names}"


def test_a_tie_goes_to_the_lowest_preference():
    """At p = 2 a ring, recursive doubling and Bruck all_gather are one exchange: the ring,
    preference 0, wins the tie."""
    ranked = selection.modelled_times("all_gather", 1024, 2, ["bruck", "recursive_doubling", "ring"],
                                      given=ringcoll.Machine())
    times = {name: t for t, name in ranked}
    assert times["ring"] == times["bruck"] == times["recursive_doubling"], times
    assert [name for _, name in ranked] == ["ring", "recursive_doubling", "bruck"]
    assert selection.choose("all_gather", "auto", 1024, 2, machine=ringcoll.Machine())[0] == "ring"


def test_a_tie_between_newer_algorithms_follows_their_bands():
    """At p = 8 and 64 KiB on gloo's default machine Rabenseifner, Swing's bandwidth form and
    Bine's butterfly (the same pairs and blocks) cost the same: the classic one wins, and
    without it Swing (10s) goes before Bine (20s), though the names alone would put Bine first."""
    names = ["bine", "swing_bandwidth", "rabenseifner"]
    ranked = selection.modelled_times("all_reduce", 65536, 8, names, given=selection.DEFAULT_MACHINE)
    assert len({t for t, _ in ranked}) == 1, ranked
    assert [name for _, name in ranked] == ["rabenseifner", "swing_bandwidth", "bine"]
    ranked = selection.modelled_times("all_reduce", 65536, 8, names[:2], given=selection.DEFAULT_MACHINE)
    assert [name for _, name in ranked] == ["swing_bandwidth", "bine"]


def test_re_registering_keeps_the_place_and_the_tie(cleanup):
    """The ring registered again (last) keeps its place at the head of the list and its ties;
    a copy with a lower preference takes both; one without a preference comes after every
    built-in one."""
    ring = registry.get("all_gather", "ring")
    registry.unregister("all_gather", "ring")
    try:
        registry.register("all_gather", "ring", cost=ring.cost, symmetry=ring.symmetry,
                          preference=ring.preference)(ring.schedule)
        assert registry.algorithms("all_gather")[0] == "ring"
        assert selection.choose("all_gather", "auto", 1024, 2, machine=ringcoll.Machine())[0] == "ring"
    finally:
        registry.register("all_gather", "ring", cost=ring.cost, symmetry=ring.symmetry,
                          preference=ring.preference, replace=True)(ring.schedule)

    def copy(rank, world, layout):
        yield from ring.schedule(rank, world, layout)

    cleanup.append(("all_gather", "test_unranked"))
    registry.register("all_gather", "test_unranked", cost=ring.cost, auto=True, check=False)(copy)
    assert registry.algorithms("all_gather")[-1] == "test_unranked"
    assert selection.choose("all_gather", "auto", 1024, 2, machine=ringcoll.Machine())[0] == "ring"
    cleanup.append(("all_gather", "test_first"))
    registry.register("all_gather", "test_first", cost=ring.cost, auto=True, check=False, preference=-1)(copy)
    assert registry.algorithms("all_gather")[0] == "test_first"
    assert selection.choose("all_gather", "auto", 1024, 2, machine=ringcoll.Machine())[0] == "test_first"


@pytest.mark.parametrize("value", ["1", 1.0, True])
def test_register_refuses_a_preference_that_is_not_an_int(value):
    before = ringcoll.algorithms("all_reduce")
    with pytest.raises(TypeError, match="preference must be None or an int, got"):
        ringcoll.register("all_reduce", "not_registered", cost=lambda p, n: ringcoll.Cost(1, 0, 0),
                          preference=value)
    assert ringcoll.algorithms("all_reduce") == before


def test_ringcoll_register_is_the_registrys():
    assert ringcoll.register is registry.register
