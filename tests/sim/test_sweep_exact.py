"""The sweep's closed-form cells against its simulated ones at the ``simulate_up_to``
boundary (#38: on a 2-level and a 4-port machine they agree or the closed form is refused),
and the lower bound with ports and nodes (a cell's ratio below 1 is a bug)."""
import os

import pytest

import ringcoll
from ringcoll.schedules import registry
from ringcoll.sim.bounds import lower_bounds
from ringcoll.sim.sweep import CLOSED_FORM_TOLERANCE, MIN_SHARE, evaluate, sweep

BOUNDARY = 16
ALGORITHMS = [(collective, name) for collective, names in sorted(registry.algorithms().items())
              for name in names if registry.get(collective, name).world is None]


def two_level(nic_ports: int, ranks_per_node: int = 8) -> ringcoll.Machine:
    return ringcoll.Machine.hierarchical(ranks_per_node, intra=(1e-6, 1 / 200e9), inter=(10e-6, 1 / 20e9),
                                         gamma=1 / 50e9, nic_ports=nic_ports)


FOUR_PORT = ringcoll.Machine(alpha=2e-6, beta=1 / 25e9, gamma=1 / 50e9, ports=4)


def boundary_cells(machine, world=BOUNDARY, sizes=(4096, 4 << 20)):
    """(collective, algorithm, nbytes, simulated cell, closed-form cell or the refusal's
    message) of every algorithm at ``world`` ranks, simulated there and forced to the
    closed form there."""
    out = []
    for collective, name in ALGORITHMS:
        for nbytes in sizes:
            simulated = evaluate(collective, name, world, nbytes, machine, simulate_up_to=world)
            assert simulated.source == "simulated"
            try:
                closed = evaluate(collective, name, world, nbytes, machine, simulate_up_to=world - 1)
            except ValueError as error:
                closed = str(error)
            out.append((collective, name, nbytes, simulated, closed))
    return out


def check_agree_or_refused(machine, cells):
    """Each closed-form cell within the tolerance of the simulated one, each refusal naming
    the algorithm and the machine; the names accepted and refused."""
    accepted, refused = set(), set()
    for collective, name, nbytes, simulated, closed in cells:
        if isinstance(closed, str):
            assert f"{collective}/{name} at {BOUNDARY} ranks" in closed and machine.describe() in closed, closed
            refused.add((collective, name))
            continue
        assert closed.source == "closed form"
        assert closed.seconds == pytest.approx(simulated.seconds, rel=CLOSED_FORM_TOLERANCE), \
            (collective, name, nbytes)
        accepted.add((collective, name))
    return accepted, refused


@pytest.mark.parametrize("nic_ports", [1, 2])
def test_two_level_closed_forms_are_refused_across_nodes_and_exact_inside_one(nic_ports):
    machine = two_level(nic_ports)
    accepted, refused = check_agree_or_refused(machine, boundary_cells(machine))
    # across 2 nodes: the closed forms' one link is not the clock's (links differ, NICs shared)
    assert not accepted and refused == set(ALGORITHMS)
    # on one node every message takes the intra-node link: the closed forms there are exact
    inside = boundary_cells(machine, world=8)
    for collective, name, _nbytes, simulated, closed in inside:
        assert not isinstance(closed, str), closed
        assert closed.seconds == pytest.approx(simulated.seconds, rel=CLOSED_FORM_TOLERANCE), (collective, name)


def test_four_port_closed_forms_agree_at_the_boundary_or_are_refused():
    accepted, refused = check_agree_or_refused(FOUR_PORT, boundary_cells(FOUR_PORT))
    # one message in and out of a rank per step: the k-port clock is the 1-port one
    assert {("all_reduce", "ring"), ("all_reduce", "rabenseifner"), ("all_reduce", "recursive_doubling"),
            ("all_reduce", "double_binary_tree"), ("broadcast", "binomial")} <= accepted
    # several messages per step go side by side on 4 ports, the closed forms serialise them
    assert {("all_gather", "direct"), ("all_to_all", "linear"), ("all_reduce", "bucket_torus"),
            ("all_reduce", "swing_torus_bandwidth")} <= refused
    # ... as a single-port machine's closed forms would be the clock's
    one = ringcoll.Machine(alpha=2e-6, beta=1 / 25e9, gamma=1 / 50e9)
    accepted_one, refused_one = check_agree_or_refused(one, boundary_cells(one, sizes=(4 << 20,)))
    assert not refused_one and accepted_one == set(ALGORITHMS)


def test_closed_forms_are_refused_below_the_smallest_share():
    """Fewer than MIN_SHARE elements per rank: chunks go empty and the clock skips them, so
    the closed form is 23 % over the clock (bucket_torus, 16 ranks, 64 B: one element each;
    4x at 4 B)."""
    machine = ringcoll.Machine()
    nbytes = 4 * BOUNDARY
    simulated = evaluate("all_reduce", "bucket_torus", BOUNDARY, nbytes, machine, simulate_up_to=BOUNDARY)
    model = registry.model(registry.get("all_reduce", "bucket_torus"), BOUNDARY, nbytes).on(machine)
    assert model > 1.2 * simulated.seconds
    with pytest.raises(ValueError, match=f"all_reduce/bucket_torus at {BOUNDARY} ranks.*under {MIN_SHARE} float32"):
        evaluate("all_reduce", "bucket_torus", BOUNDARY, nbytes, machine, simulate_up_to=BOUNDARY - 1)
    enough = 4 * MIN_SHARE * BOUNDARY
    assert evaluate("all_reduce", "ring", BOUNDARY, enough, machine, simulate_up_to=1).source == "closed form"


def test_sweep_refuses_before_running_naming_every_refused_cell():
    machine = two_level(1, ranks_per_node=4)
    with pytest.raises(ValueError) as error:
        sweep(["all_reduce"], [8, 16], [1 << 20], machine, algorithms=["ring", "rabenseifner"], simulate_up_to=8,
              progress=lambda: pytest.fail("a cell ran before the refusal"))
    text = str(error.value)
    assert "2 cell(s) above simulate_up_to=8" in text
    assert "all_reduce/ring at 16 ranks" in text and "all_reduce/rabenseifner at 16 ranks" in text
    assert machine.describe() in text
    cells = sweep(["all_reduce"], [8, 16], [1 << 20], machine, algorithms=["ring", "rabenseifner"], simulate_up_to=16)
    assert {cell.source for cell in cells} == {"simulated"}


def test_the_tolerance_is_stated_in_the_docs():
    docs = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "simulator.md")).read()
    assert f"within {CLOSED_FORM_TOLERANCE:.1%}" in docs and f"{MIN_SHARE} elements" in docs


def test_the_lower_bound_counts_ports():
    n = 1 << 20
    bound = lower_bounds("all_reduce", 16, n, ports=4)
    assert bound.steps == 2 and bound.bytes_moved == pytest.approx(2 * 15 / 16 * n / 4)
    assert bound.bytes_reduced == pytest.approx(15 / 16 * n)
    assert lower_bounds("broadcast", 25, n, ports=4).steps == 2 and lower_bounds("broadcast", 26, n, ports=4).steps == 3
    assert lower_bounds("all_reduce", 16, n) == (4, 2 * 15 / 16 * n, 15 / 16 * n)


BOUND_MACHINES = {"flat": ringcoll.Machine(alpha=2e-6, beta=1 / 25e9, gamma=1 / 50e9), "4-port": FOUR_PORT,
                  "2-level nic 1": two_level(1, ranks_per_node=4), "2-level nic 2": two_level(2, ranks_per_node=4)}


@pytest.mark.parametrize("name", sorted(BOUND_MACHINES))
def test_no_cell_beats_the_lower_bound(name):
    """Every algorithm of every collective, at powers of two and others, three sizes: the
    simulated time over the bound (ports, nodes and NICs counted) is at least 1."""
    machine = BOUND_MACHINES[name]
    below = []
    for world in (2, 5, 8, 12, 16):
        cells = sweep(sorted(registry.algorithms()), [world], [4, 64 << 10, 4 << 20], machine,
                      simulate_up_to=world)
        below += [(c.collective, c.algorithm, c.world, c.nbytes, c.bound_ratio) for c in cells
                  if not c.bound_ratio >= 1 - 1e-9]
    assert not below, below


@pytest.mark.parametrize("machine, said", [
    (ringcoll.Machine.torus((4, 4)), "network machine"),
    (ringcoll.Machine.loggp(L=2e-6, o=1e-6, g=0.5e-6), "o, g, L and window of 2"),
    (ringcoll.Machine(window=3), "window of 3")])
def test_closed_forms_are_refused_where_messages_share_links_or_overlap(machine, said):
    """A network routes messages over shared links; LogGP's o, g, L and a window overlap what
    the closed forms add up: none is the clock's there (the simulated cell shows the gap)."""
    simulated = evaluate("all_reduce", "ring", BOUNDARY, 4 << 20, machine, simulate_up_to=BOUNDARY)
    assert simulated.source == "simulated" and simulated.seconds > 0
    with pytest.raises(ValueError, match=f"all_reduce/ring at {BOUNDARY} ranks on .*{said}"):
        evaluate("all_reduce", "ring", BOUNDARY, 4 << 20, machine, simulate_up_to=BOUNDARY - 1)
