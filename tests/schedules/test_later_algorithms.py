"""The algorithms beyond rings and trees (direct, Swing, Bine, PAT, 2-D torus, hierarchical): exact
results in the simulator at every world size, the closed forms the general clock test
(test_study.py, every registered algorithm) cannot take alone (PAT's blocks, hierarchical
layouts), node layouts; the built-in comparisons on gloo run in the collective's own test file,
which takes every registered algorithm."""
from __future__ import annotations

import functools

import pytest
import torch

import ringcoll
from _util import ringcoll_log
from ringcoll.schedules import registry
from ringcoll.sim.simulate import BUILDER_OF, rank_data

R = ringcoll.ReduceOp
WORLDS = tuple(range(1, 18)) + (32, 64)
LATER = {
    "all_reduce": ("direct", "swing_latency", "swing_bandwidth", "swing_torus_bandwidth", "swing_torus_latency",
                   "bine", "torus2d", "bucket_torus", "hierarchical", "rabenseifner_far", "nccl_ring", "nccl_tree"),
    "reduce_scatter": ("direct", "pat", "hierarchical"),
    "all_gather": ("direct", "pat", "hierarchical"),
    "broadcast": ("bine", "bine_near", "hierarchical"),
    "reduce": ("bine", "bine_near", "hierarchical"),
}
#: a machine whose α, β and γ are of the same order at the sizes below, so a wrong term shows
MACHINE = dict(alpha=5e-6, beta=1e-9, gamma=3e-10)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def numels(world):
    return sorted({0, 1, max(world - 1, 0), world + 1, 1000})


def xor_of(world, numel):
    return functools.reduce(torch.bitwise_xor, [rank_data(r, numel) for r in range(world)])


def params_for(collective, world):
    return {"broadcast": {"src": world // 2}, "reduce": {"dst": world // 2}}.get(collective, {})


def cost_only(collective, algorithm, world, numel, **kwargs):
    """The simulator's cost-only run of ``collective`` on float32 (numel: the cost model's n
    in elements) on :data:`MACHINE`."""
    return ringcoll.simulate(BUILDER_OF.get(collective, collective), algorithm, world, numel=numel,
                             dtype=torch.float32, machine=ringcoll.Machine(**MACHINE), data=False,
                             record=False, **kwargs)


def simulated(collective, algorithm, world, numel, **kwargs):
    """Each rank's result of ``collective`` on rank_data inputs (block numel for the list-style
    collectives), and the exact expectation."""
    if collective == "all_reduce":
        sim = ringcoll.simulate("all_reduce", algorithm, world, numel=numel, op=R.BXOR, **kwargs)
        return [out[0] for out in sim.outputs], [xor_of(world, numel)] * world
    if collective == "reduce_scatter":
        full = [rank_data(r, world * numel) for r in range(world)]
        sim = ringcoll.simulate("reduce_scatter_tensor", algorithm, world, op=R.BXOR,
                                call=lambda r: ((torch.zeros(numel, dtype=torch.int64), full[r]), {}), **kwargs)
        total = functools.reduce(torch.bitwise_xor, full)
        return [out[0] for out in sim.outputs], [total[r * numel:(r + 1) * numel] for r in range(world)]
    if collective == "all_gather":
        sim = ringcoll.simulate("all_gather_into_tensor", algorithm, world,
                                call=lambda r: ((torch.zeros(world * numel, dtype=torch.int64),
                                                 rank_data(r, numel) * (r + 3)), {}), **kwargs)
        want = torch.cat([rank_data(r, numel) * (r + 3) for r in range(world)])
        return [torch.cat([v.reshape(-1) for v in out]) if numel else want[:0] for out in sim.outputs], [want] * world
    root = world // 2
    if collective == "broadcast":
        sim = ringcoll.simulate("broadcast", algorithm, world, numel=numel, src=root, **kwargs)
        return [out[0] for out in sim.outputs], [rank_data(root, numel)] * world
    sim = ringcoll.simulate("reduce", algorithm, world, numel=numel, dst=root, op=R.BXOR, **kwargs)
    return [sim.outputs[root][0]], [xor_of(world, numel)]


CASES = [(c, a) for c, names in LATER.items() for a in names]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_exact_at_every_world_and_size(collective, algorithm):
    for world in WORLDS:
        for numel in numels(world):
            got, want = simulated(collective, algorithm, world, numel)
            for rank, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), f"{collective}/{algorithm} world {world} numel {numel} rank {rank}"


@pytest.mark.parametrize("algorithm", LATER["all_reduce"])
@pytest.mark.parametrize("world", [3, 6, 8, 12, 16])
def test_float_all_reduce_bitwise_identical(algorithm, world):
    inputs = [torch.randn(1001, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    sim = ringcoll.simulate("all_reduce", algorithm, world, inputs=inputs)
    torch.testing.assert_close(sim.outputs[0][0], sum(inputs), rtol=1e-5, atol=1e-5)
    for rank, (got,) in enumerate(sim.outputs):
        assert torch.equal(got.view(torch.int32), sim.outputs[0][0].view(torch.int32)), f"rank {rank}"


def test_swing_pairs_nest_and_bine_trees_span():
    from ringcoll.schedules.bine import bine_tree, bine_tree_near
    from ringcoll.schedules.swing import swing_blocks, swing_peer

    assert [swing_peer(0, s, 1024) for s in range(5)] == [1, 1023, 3, 1019, 11]
    for k in range(1, 11):
        blocks = swing_blocks(1 << k)
        assert sorted(b[-1] for b in blocks) == [(i, i + 1) for i in range(1 << k)]
    for world, tree in ((w, t) for w in range(1, 300) for t in (bine_tree, bine_tree_near)):
        parent, _ = tree(world)
        for vrank in range(world):          # every vrank reaches the root
            seen, up = 0, vrank
            while parent[up] is not None:
                up, seen = parent[up], seen + 1
                assert seen <= world
            assert up == 0


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("segment_bytes", [8, 24, 100000])
def test_pat_bounds_its_aggregation(monkeypatch, collective, segment_bytes):
    """Blocks of 8 bytes (int64), segments of 1, 3 or many blocks: exact, and the messages
    and the time are what the closed form says."""
    monkeypatch.setenv("RINGCOLL_SEGMENT", str(segment_bytes))
    per_message = max(1, segment_bytes // 8)
    for world in (2, 5, 8, 13, 16):
        got, want = simulated(collective, "pat", world, 1)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"world {world}"
        sim = cost_only(collective, "pat", world, world * 2)        # float32 blocks of 2: 8 bytes
        cost = registry.model(registry.get(collective, "pat"), world, world * 8, segment=segment_bytes)
        assert sim.stats.time == pytest.approx(cost.time(*MACHINE.values()), rel=1e-9)
        messages = sim.stats.ranks[0].messages
        assert messages == cost.alpha
        if per_message == 1:
            assert messages == world - 1
        elif per_message > world:
            assert messages == (world - 1).bit_length()


HIERARCHICAL = [c for c, names in LATER.items() if "hierarchical" in names]


@pytest.mark.parametrize("collective", HIERARCHICAL)
@pytest.mark.parametrize("local_size", [1, 3, 4])
def test_hierarchical_even_and_uneven_nodes(collective, local_size):
    """Nodes of local_size consecutive ranks, the last one smaller when it does not divide p."""
    for world in tuple(range(1, 18)):
        for numel in numels(world):
            got, want = simulated(collective, "hierarchical", world, numel, local_size=local_size)
            for rank, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), f"{collective} L={local_size} world {world} numel {numel} rank {rank}"


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_nodes_of_scattered_ranks(collective):
    """Nodes as hostname grouping may give them: ranks interleaved, sizes 3, 2 and 1 ... ."""
    for nodes in [(0, 1, 0, 1, 0, 2), (2, 2, 1, 0, 1, 2, 0), (0, 1, 2, 3, 0), (1, 0)]:
        world = len(nodes)
        for numel in (1, world + 2, 1000):
            got, want = simulated(collective, "hierarchical", world, numel, local_size=nodes)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{collective} nodes {nodes} numel {numel}"


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_cost_equals_the_port_clock(monkeypatch, collective):
    for local_size in (2, 4):
        monkeypatch.setenv("RINGCOLL_LOCAL_SIZE", str(local_size))         # registry.model reads it
        for world in (4, 8, 12, 16, 32):
            numel = world * 96
            clock = cost_only(collective, "hierarchical", world, numel, local_size=local_size,
                              **params_for(collective, world)).stats.time
            model = registry.model(registry.get(collective, "hierarchical"), world, numel * 4).time(*MACHINE.values())
            assert clock == pytest.approx(model, rel=1e-9), f"{collective} L={local_size} world {world}"


def test_torus_grid():
    from ringcoll.schedules.hierarchical import torus_grid

    assert [torus_grid(p) for p in (1, 2, 6, 12, 16, 17, 64, 1024)] == \
        [(1, 1), (2, 1), (3, 2), (4, 3), (4, 4), (17, 1), (8, 8), (32, 32)]
    assert ringcoll.simulate("all_reduce", "torus2d", 12, numel=120).stats.steps == 2 * (4 - 1) + 2 * (3 - 1)


# -- auto: measured rules, tuning table, model ------------------------------------------------
from ringcoll import selection  # noqa: E402
from ringcoll.runtime.nodes import even_nodes  # noqa: E402


def test_measured_rules_decide_only_where_they_were_measured(plain_env):
    name, why = selection.choose("all_reduce", "auto", 4096, 4)
    assert name == "recursive_doubling" and "rule measured up to p=4" in why
    for world in (5, 16, 64):               # beyond the measurements: the model
        name, why = selection.choose("all_reduce", "auto", 4096, world)
        assert "auto: model (default machine)" in why
        best = min(ringcoll.algorithms("all_reduce"),
                   key=lambda n: float("inf") if n == "direct" and world > 8 else
                   registry.get("all_reduce", n).cost(world, 4096).time(5e-6, 1e-10, 5e-11))
        want = registry.get("all_reduce", best).cost(world, 4096).time(5e-6, 1e-10, 5e-11)
        got = registry.get("all_reduce", name).cost(world, 4096).time(5e-6, 1e-10, 5e-11)
        assert got == pytest.approx(want)
    # an unmeasured literature rule that would decide hands over to the model
    assert "model" in selection.choose("all_gather", "auto", 1024, 3)[1]
    for rule in selection.RULES:
        assert rule.measured_upto is None or rule.measured_upto >= 2, rule


def test_model_follows_the_machine(plain_env, tmp_path):
    """A machine where messages cost nothing and bytes everything takes the fewest bytes; one
    where a message costs a second takes the fewest messages."""
    latency, bandwidth = tmp_path / "latency.json", tmp_path / "bandwidth.json"
    latency.write_text('{"alpha": 1.0, "beta": 1e-12, "gamma": 0}')
    bandwidth.write_text('{"alpha": 0, "beta": 1e-9, "gamma": 1e-9}')
    plain_env.setenv("RINGCOLL_MACHINE", str(latency))
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 16)
    assert str(latency) in why and registry.get("all_reduce", name).cost(16, 1 << 20).alpha == 4
    assert selection.choose("all_gather", "auto", 1 << 20, 12)[0] in ("bruck", "pat")
    plain_env.setenv("RINGCOLL_MACHINE", str(bandwidth))
    name, _ = selection.choose("all_reduce", "auto", 1 << 20, 16)
    assert registry.get("all_reduce", name).cost(16, 1 << 20).beta == pytest.approx(2 * 15 / 16 * (1 << 20))
    assert selection.choose("all_reduce", "auto", 64, 5)[0] != "direct"


#: p = 16, 1 MiB: a machine where a message costs 1 ms and one where a byte costs 1 ns
HIGH_ALPHA = ringcoll.Machine(alpha=1e-3, beta=1 / 100e9, gamma=1 / 200e9)
HIGH_BETA = ringcoll.Machine(alpha=1e-7, beta=1e-9, gamma=1 / 200e9)


def formula_best(collective, nbytes, world, machine):
    """The least closed-form time on ``machine``, as the formulas give it (direct only at p <= 8)."""
    names = [n for n in ringcoll.algorithms(collective) if not (n == "direct" and world > 8)]
    return min(registry.get(collective, n).cost(world, nbytes).on(machine) for n in names)


def test_saved_machines_change_the_choice_as_the_formulas_predict(plain_env, tmp_path):
    """Machine.save / Machine.load is the one path: at p = 16 and 1 MiB the high-α machine
    takes lg p = 4 whole-vector messages (recursive doubling: 4α + 4nβ beats Rabenseifner's
    8α + 2(p-1)/p·nβ by 4 ms - 0.04 ms), the high-β machine the bandwidth-optimal form
    (2(p-1)/p·n = 1.97 MB on the wire instead of 4 MiB)."""
    n, world = 1 << 20, 16
    chosen = {}
    for label, machine in (("alpha", HIGH_ALPHA), ("beta", HIGH_BETA)):
        path = tmp_path / f"{label}.json"
        machine.save(str(path))
        plain_env.setenv("RINGCOLL_MACHINE", str(path))
        name, why = selection.choose("all_reduce", "auto", n, world)
        assert why.startswith(f"auto: model ({path})"), why
        cost = registry.get("all_reduce", name).cost(world, n)
        assert cost.on(machine) == pytest.approx(formula_best("all_reduce", n, world, machine))
        chosen[label] = (name, cost)
    (_, alpha_cost), (_, beta_cost) = chosen["alpha"], chosen["beta"]
    assert chosen["alpha"][0] != chosen["beta"][0]
    assert alpha_cost.alpha == 4 and alpha_cost.beta == 4 * n
    assert beta_cost.beta == pytest.approx(2 * 15 / 16 * n) and beta_cost.alpha > 4


def test_fitted_machine_file_is_the_model(plain_env, tmp_path):
    """``ringcoll.fit(...).save(path)`` with RINGCOLL_MACHINE=path: auto takes the least
    closed-form time on the fitted machine, and names the file."""
    import pathlib

    run = pathlib.Path(__file__).resolve().parents[2] / "bench" / "results" / "20261202T144510Z_np4_gloo.json"
    fitted = ringcoll.fit([str(run)])
    path = tmp_path / "fitted.json"
    fitted.save(str(path))
    assert ringcoll.Machine.load(str(path)) == fitted
    plain_env.setenv("RINGCOLL_MACHINE", str(path))
    for world, n in ((16, 4096), (64, 1 << 24)):
        name, why = selection.choose("all_reduce", "auto", n, world)
        assert str(path) in why
        assert registry.get("all_reduce", name).cost(world, n).on(fitted) == \
            pytest.approx(formula_best("all_reduce", n, world, fitted))


def test_options_machine_wins_over_the_file(plain_env, tmp_path):
    path = tmp_path / "beta.json"
    HIGH_BETA.save(str(path))
    plain_env.setenv("RINGCOLL_MACHINE", str(path))
    name, why = selection.choose("all_reduce", "auto", 1 << 20, 16, machine=HIGH_ALPHA)
    assert why.startswith("auto: model (given machine)")
    assert registry.get("all_reduce", name).cost(16, 1 << 20).alpha == 4
    assert ringcoll.Options(machine=HIGH_ALPHA).machine is HIGH_ALPHA
    with pytest.raises(TypeError, match="machine must be a ringcoll.Machine, got dict"):
        ringcoll.Options(machine={"alpha": 1.0})


def test_simulate_auto_weighs_the_simulated_machine(plain_env, caplog):
    """``simulate(..., "auto", machine=M)``: auto's model is M, the machine the ranks run on.
    At p = 16 and 1 MiB the high-α machine and the high-β one choose differently, each the
    least closed-form time on it, and ``sim.algorithm`` is the algorithm chosen."""
    n, world = 1 << 20, 16
    chosen = {}
    for label, machine in (("alpha", HIGH_ALPHA), ("beta", HIGH_BETA)):
        caplog.clear()
        with caplog.at_level("INFO", logger="ringcoll"):
            sim = ringcoll.simulate("all_reduce", "auto", world, numel=n // 4, dtype=torch.float32,
                                    machine=machine, data=False, record=False)
        want, _ = selection.choose("all_reduce", "auto", n, world, machine=machine)
        assert sim.algorithm.name == want
        assert sim.cost.on(machine) == pytest.approx(formula_best("all_reduce", n, world, machine))
        line = next(r.getMessage() for r in caplog.records if "rank 0 ->" in r.getMessage())
        assert f"-> {sim.algorithm.name} (auto: model (given machine)" in line, line
        chosen[label] = sim.algorithm.name
    assert chosen["alpha"] != chosen["beta"]


def test_simulate_auto_prices_node_aware_candidates_on_the_simulated_nodes(plain_env, monkeypatch):
    """Inside ``simulate(..., "auto", local_size=4)`` the model simulates the hierarchical
    candidates on the simulated nodes of 4, not on RINGCOLL_LOCAL_SIZE's 2."""
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "2")
    seen, real = [], selection.model._simulated_time

    def spy(collective, name, world, n, on, nodes):
        if name == "hierarchical":
            seen.append(nodes)
        return real(collective, name, world, n, on, nodes)

    monkeypatch.setattr(selection.model, "_simulated_time", spy)
    monkeypatch.setattr(selection.model, "_simulated", {})
    for collective in ("all_reduce", "broadcast", "reduce", "all_gather"):
        seen.clear()
        ringcoll.simulate(collective, "auto", 24, numel=24 * 4096, local_size=4, data=False, record=False)
        assert seen and set(seen) == {even_nodes(24, 4)}, (collective, seen)


@pytest.mark.parametrize("text,message", [
    ('{"alpha": "fast"}', "alpha must be a non-negative number"),
    ("{alpha: 1}", "not a ringcoll.Machine JSON"),
    ('{"alpha": 1e-6, "latency": 2}', "unknown"),
])
def test_bad_machine_file_names_the_variable_and_path(plain_env, tmp_path, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    plain_env.setenv("RINGCOLL_MACHINE", str(bad))
    with pytest.raises(ValueError, match=message) as caught:
        selection.choose("all_reduce", "auto", 64, 16)
    assert f"RINGCOLL_MACHINE={bad}" in str(caught.value)
    plain_env.setenv("RINGCOLL_MACHINE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="RINGCOLL_MACHINE names .*missing.json.*cannot be read"):
        selection.choose("all_reduce", "auto", 64, 16)


def options_machine_log(machine):
    """The log line of one all_gather on a ringcoll group whose Options carry ``machine``."""
    import torch.distributed as dist

    with ringcoll_log() as records:
        group = dist.new_group(backend="ringcoll", pg_options=ringcoll.Options(machine=machine))
        out = torch.empty(3 * 4096)
        dist.all_gather_into_tensor(out, torch.full((4096,), float(dist.get_rank() + 1)), group=group)
    return records, out[::4096].tolist()


def test_options_machine_reaches_auto_on_a_group(clusters):
    """p = 3, 48 KiB gathered: no measured rule covers it, so the group's machine decides."""
    for records, firsts in clusters(3).run(options_machine_log, HIGH_ALPHA):
        assert firsts == [1.0, 2.0, 3.0]
        line = next((r for r in records if " -> " in r), records)
        assert "(auto: model (given machine)" in line, line
        want = selection.choose("all_gather", "auto", 3 * 4096 * 4, 3, machine=HIGH_ALPHA)[0]
        assert f"-> {want} (" in line, line


def test_direct_only_for_small_worlds(plain_env):
    """The model weighs direct only at p <= 8 (under one port per rank its p - 1 messages
    serialise, so it ties at best: the classic algorithm then wins)."""
    names = ringcoll.algorithms("all_gather")
    assert "direct" in [n for _, n in selection.modelled_times("all_gather", 64, 8, names)]
    assert "direct" not in [n for _, n in selection.modelled_times("all_gather", 64, 9, names)]
    ranked = selection.modelled_times("all_gather", 64, 3, names)
    assert dict((n, t) for t, n in ranked)["direct"] == ranked[0][0]         # a tie at p = 3 ...
    assert selection.choose("all_gather", "auto", 64, 3)[0] not in selection.FRONTIER   # ... the classic wins


def test_tuning_table_is_followed(plain_env, tmp_path):
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\n"
                     "all_reduce,4,0,65535,ring\n"
                     "all_reduce,4,65536,1048576,swing_bandwidth\n"
                     "all_gather_into_tensor,3,0,100,pat\n")
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    assert selection.choose("all_reduce", "auto", 4096, 4) == ("ring", f"auto: tuning table {table}:2")
    assert selection.choose("all_reduce", "auto", 65536, 4)[0] == "swing_bandwidth"
    assert selection.choose("all_gather", "auto", 100, 3)[1].endswith(":4")
    assert "rule" in selection.choose("all_reduce", "auto", 2 << 20, 4)[1]        # no row: the rules
    assert "model" in selection.choose("all_reduce", "auto", 4096, 16)[1]         # no row for p = 16
    plain_env.setenv("RINGCOLL_ALGO", "all_reduce=rabenseifner")                   # the override still wins
    assert selection.choose("all_reduce", "auto", 4096, 4) == ("rabenseifner", "RINGCOLL_ALGO")


@pytest.mark.parametrize("text,message", [
    ("collective,world,min,max,algorithm\n", "line 1 must be the header"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,zero,10,ring\n", r":2: min_bytes must be an integer"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,0,10,rnig\n", r":2: all_reduce has no algorithm 'rnig'"),
    ("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduse,4,0,10,ring\n", "collective must be one of"),
])
def test_bad_tuning_table_names_file_line_and_field(plain_env, tmp_path, text, message):
    table = tmp_path / "table.csv"
    table.write_text(text)
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    with pytest.raises(ValueError, match=message):
        selection.choose("all_reduce", "auto", 64, 4)


def test_debug_log_names_the_source(plain_env, tmp_path, caplog):
    table = tmp_path / "table.csv"
    table.write_text("collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,0,100,direct\n")
    plain_env.setenv("RINGCOLL_TUNING", str(table))
    with caplog.at_level("INFO", logger="ringcoll"):
        for world, numel in ((4, 10), (4, 1000), (16, 10)):
            ringcoll.simulate("all_reduce", "auto", world, numel=numel)
    sources = [r.getMessage() for r in caplog.records if "rank 0 ->" in r.getMessage()]
    assert "direct (auto: tuning table" in sources[0]
    assert "(auto: rule measured up to p=4" in sources[1]
    assert "(auto: model (default machine)" in sources[2]      # simulate without machine=: none given


# -- real gloo ranks against the built-ins ------------------------------------------------------
def gloo_values(rank, numel, dtype):
    raw = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1
    if dtype.is_floating_point:
        return (raw.to(torch.float64) * (0.5 if rank % 2 else -0.25) + 0.1 * rank).to(dtype)
    return raw.to(dtype)


def compare_frontier_with_builtin(local_size):
    """Every frontier algorithm of every collective against torch.distributed on this rank;
    returns the problems and the bits of the replicated results (equal on every rank)."""
    import os

    import torch.distributed as dist

    if local_size:
        os.environ["RINGCOLL_LOCAL_SIZE"] = str(local_size)
    rank, world = dist.get_rank(), dist.get_world_size()
    problems, bits = [], []
    cases = [(torch.int64, R.SUM, world + 1), (torch.float32, R.SUM, 1000), (torch.bfloat16, R.MAX, 7),
             (torch.float64, R.AVG, 1)]
    try:
        for dtype, op, numel in cases:
            tag = f"{dtype} {op} numel {numel}"
            for name in LATER["all_reduce"]:
                got, want = gloo_values(rank, numel, dtype), gloo_values(rank, numel, dtype)
                ringcoll.all_reduce(got, op=op, algorithm=name)
                dist.all_reduce(want, op=op)
                if not torch.allclose(got.double(), want.double(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-5):
                    problems.append(f"all_reduce/{name} {tag}")
                bits.append(got.view(torch.uint8).numpy().tobytes())
            for name in LATER["all_gather"]:
                tensor = gloo_values(rank, numel, dtype)
                got, want = torch.zeros(world * numel, dtype=dtype), torch.zeros(world * numel, dtype=dtype)
                ringcoll.all_gather_into_tensor(got, tensor, algorithm=name)
                dist.all_gather_into_tensor(want, tensor)
                if not torch.equal(got, want):
                    problems.append(f"all_gather/{name} {tag}")
            if dtype != torch.bfloat16:        # gloo's reduce_scatter_tensor has no bfloat16 MAX
                for name in LATER["reduce_scatter"]:
                    full = gloo_values(rank, world * numel, dtype)
                    got, want = torch.zeros(numel, dtype=dtype), torch.zeros(numel, dtype=dtype)
                    ringcoll.reduce_scatter_tensor(got, full, op=op, algorithm=name)
                    dist.reduce_scatter_tensor(want, full.clone(), op=op)
                    if not torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-5):
                        problems.append(f"reduce_scatter/{name} {tag}")
            root = world - 1
            for name in LATER["broadcast"]:
                got = gloo_values(rank, numel, dtype)
                ringcoll.broadcast(got, src=root, algorithm=name)
                if not torch.equal(got, gloo_values(root, numel, dtype)):
                    problems.append(f"broadcast/{name} {tag}")
            if op != R.AVG:
                for name in LATER["reduce"]:
                    got, want = gloo_values(rank, numel, dtype), gloo_values(rank, numel, dtype)
                    ringcoll.reduce(got, dst=root, op=op, algorithm=name)
                    dist.reduce(want, dst=root, op=op)
                    if rank == root and not torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-5):
                        problems.append(f"reduce/{name} {tag}")
    finally:
        os.environ.pop("RINGCOLL_LOCAL_SIZE", None)
    return problems, bits


@pytest.mark.parametrize("world,local_size", [(3, None), (4, 2), (5, 2)])
def test_matches_builtin_on_gloo(clusters, world, local_size):
    """Worlds 3 (odd, a prime: torus2d is the ring), 4 on two emulated nodes of 2, 5 on
    uneven nodes (2, 2, 1)."""
    answers = clusters(world).run(compare_frontier_with_builtin, local_size)
    for rank, (problems, _) in enumerate(answers):
        assert not problems, f"rank {rank}: {problems[:6]}"
    for rank, (_, bits) in enumerate(answers):
        assert bits == answers[0][1], f"rank {rank}'s all_reduce results differ in bits from rank 0's"


def test_bad_local_size_is_refused(plain_env):
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "two")
    with pytest.raises(ValueError, match="RINGCOLL_LOCAL_SIZE='two' is not valid: RINGCOLL_LOCAL_SIZE accepts a positive integer \\(ranks per node\\)"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8)
    plain_env.delenv("RINGCOLL_LOCAL_SIZE")
    with pytest.raises(ValueError, match="local_size must be a positive int, got 0"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8, local_size=0)
    with pytest.raises(ValueError, match="must give the node of each of the 4 ranks, got 3"):
        ringcoll.simulate("all_reduce", "hierarchical", 4, numel=8, local_size=(0, 0, 1))


def test_model_local_size_of_node_layouts(plain_env):
    """The cost models' L of a node layout: the ranks per node, the last rank's node allowed
    fewer (nodes of L consecutive ranks); simulate's cost takes it, not the environment's."""
    from ringcoll.runtime.nodes import even_nodes, model_local_size

    assert model_local_size(None) is None
    assert [model_local_size(even_nodes(p, 4)) for p in (3, 4, 10, 12)] == [3, 4, 4, 4]
    assert model_local_size((0, 1, 0, 1)) == 2                  # equal nodes, ranks interleaved
    assert model_local_size((0, 0, 1, 1, 1)) is None            # the last node holds more
    assert model_local_size((0, 1, 0, 1, 0, 2)) is None         # nodes of 3, 2 and 1
    plain_env.setenv("RINGCOLL_LOCAL_SIZE", "2")
    algorithm = registry.get("all_reduce", "hierarchical")
    sim = ringcoll.simulate("all_reduce", "hierarchical", 8, numel=96, data=False, local_size=3)
    layout = ringcoll.simulate("all_reduce", "hierarchical", 8, numel=96, data=False,
                               local_size=(0, 0, 0, 1, 1, 1, 2, 2))
    assert sim.cost == layout.cost                              # L = 3 given, or read off the nodes
    assert sim.cost != registry.model(algorithm, 8, 96 * 8)     # not the environment's L = 2


# -- a 2-level machine: where hierarchical wins, and where it does not -------------------------
def test_hierarchical_wins_on_two_levels_as_the_formulas_predict():
    """The study map's machine (bench/study_2level.py): nodes of L = 4, intra (αi, βi), inter
    (αo, βo) through one NIC port per node. With N = p / L nodes:
    flat ring: every step pays the slow link, one message per NIC at a time:
        2(p-1)(αo + n/p·βo) + (p-1)/p·nγ;
    hierarchical: rings inside (L-1 steps each way), then the N-node ring of each rank's
    n/L shard, the NIC carrying the node's L messages of each of its 2(N-1) steps one after
    another (which hides the inter-node reductions):
        2(L-1)(αi + n/L·βi) + (L-1)/L·nγ + 2(N-1)·L·(αo + n/(NL)·βo);
    Rabenseifner far first (``rabenseifner_far``): its first and last steps (distance p/2) send
    n/2 from all L ranks of a node through one NIC: at least 2L(αo + n/2·βo). In MPICH's order
    (``rabenseifner``) the halves of n/2 .. n/L stay inside the node and the first step between
    nodes (distance L) sends n/(2L) from each of the L ranks: at least 2L(αo + n/(2L)·βo).
    At p = 16 and 16 MiB hierarchical beats the ring and far-first Rabenseifner (MPICH's order
    comes within a few per cent of it: 3.19 against 3.27 ms); at p = 4 (one node) it is the
    ring and Rabenseifner beats it; at p = 64 and 4 KiB Rabenseifner's 2 lg p steps beat its
    2(L+N-2)."""
    from experiments.study_2level import MACHINE

    L = MACHINE.ranks_per_node
    ai, bi, ao, bo, g = MACHINE.alpha, MACHINE.beta, MACHINE.inter_alpha, MACHINE.inter_beta, MACHINE.gamma

    def simulated(name, world, n):
        return ringcoll.simulate("all_reduce", name, world, numel=n // 4, dtype=torch.float32, data=False,
                                 record=False, machine=MACHINE, local_size=L).stats.time

    def ring(p, n):
        hop = (ao, bo) if p > L else (ai, bi)
        return 2 * (p - 1) * (hop[0] + n / p * hop[1]) + (p - 1) / p * n * g

    def hierarchical(p, n):
        nodes = p // L
        return 2 * (L - 1) * (ai + n / L * bi) + (L - 1) / L * n * g + 2 * (nodes - 1) * L * (ao + n / p * bo)

    p, n = 16, 16 << 20
    assert simulated("ring", p, n) == pytest.approx(ring(p, n), rel=1e-9)
    assert simulated("hierarchical", p, n) == pytest.approx(hierarchical(p, n), rel=1e-9)
    assert simulated("rabenseifner_far", p, n) >= 2 * L * (ao + n / 2 * bo)
    assert simulated("rabenseifner", p, n) >= 2 * L * (ao + n / (2 * L) * bo)
    assert hierarchical(p, n) < ring(p, n) and hierarchical(p, n) < 2 * L * (ao + n / 2 * bo)
    assert simulated("rabenseifner", p, n) < simulated("rabenseifner_far", p, n) / 3
    # one node: hierarchical is the ring, and the ring loses to Rabenseifner
    p, n = L, 1 << 20
    assert simulated("hierarchical", p, n) == pytest.approx(ring(p, n), rel=1e-9)
    assert simulated("hierarchical", p, n) > simulated("rabenseifner", p, n)
    # many nodes, small message: latency decides
    p, n = 64, 4096
    assert simulated("hierarchical", p, n) > simulated("rabenseifner", p, n)


# -- docstrings follow the registry --------------------------------------------------------------
def test_algorithm_docs_list_every_registered_algorithm():
    """Every public call's ``algorithm`` argument names exactly the algorithms its collective
    registers (``ringcoll.algorithms(collective)``), so a new one cannot leave it stale."""
    import inspect
    import re

    from ringcoll.sim.simulate import COLLECTIVE_OF

    documented = {}
    for name in ringcoll.__all__:
        fn = getattr(ringcoll, name)
        if not callable(fn) or inspect.isclass(fn):
            continue
        doc = inspect.getdoc(fn) or ""
        paragraph = re.search(r"^ *algorithm \(str[^)]*\):(.*?)(?=^ *\w+ \(|^\S|\Z)", doc, re.S | re.M)
        if paragraph is None:
            continue
        collective = re.search(r'ringcoll\.algorithms\("(\w+)"\)', paragraph.group(1))
        assert collective, f"{name}: the algorithm argument should say ringcoll.algorithms(collective)"
        assert collective.group(1) == COLLECTIVE_OF.get(name, "all_reduce" if name == "ddp_comm_hook" else name)
        listed = set(re.findall(r"``([a-z_0-9]+)``", paragraph.group(1))) - {"auto"}
        assert listed == set(ringcoll.algorithms(collective.group(1))), \
            f"{name}: documents {sorted(listed)}, registered {ringcoll.algorithms(collective.group(1))}"
        documented[name] = collective.group(1)
    assert {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "reduce_scatter",
            "reduce_scatter_single", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
            "ddp_comm_hook"} <= set(documented), sorted(documented)


@pytest.mark.parametrize("algorithm", ["nccl_ring", "nccl_tree"])
@pytest.mark.parametrize("local_size", [1, 2, 3, 4])
def test_nccl_algorithms_exact_on_nodes(algorithm, local_size):
    """NCCL's ring on channels (one ring per rank of a node, each leaving its node from a
    different rank) and its tree (chains inside nodes under a double binary tree over the
    nodes) give the exact result on even and uneven nodes."""
    for world in range(1, 14):
        for numel in numels(world):
            got, want = simulated("all_reduce", algorithm, world, numel, local_size=local_size)
            for rank, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), f"{algorithm} world {world} nodes of {local_size} numel {numel} rank {rank}"


def test_nccl_channel_rings_and_trees():
    """The channels' rings leave each node from a different rank; the tree is a chain per
    node whose first rank sits in NCCL's double binary tree over the nodes."""
    from ringcoll.schedules.nccl import channel_rings, nccl_trees

    assert channel_rings((0, 0, 0)) == [(0, 1, 2)]
    assert channel_rings((0, 0, 1, 1)) == [(0, 1, 2, 3), (1, 0, 3, 2)]
    first, second = nccl_trees((0, 0, 1, 1, 2, 2))
    # nodes 0, 1, 2: NCCL's btree over 3 nodes has node 0 on top with child 2, node 2 above 1
    assert first.parent == (None, 0, 4, 2, 0, 4)
    assert [first.children[r] for r in (0, 4)] == [(1, 4), (5, 2)]
    assert second.parent[0] is not None or second.parent[2] is not None     # another top
