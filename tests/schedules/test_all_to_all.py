"""all_to_all and all_to_all_single: every algorithm in the simulator on exact data, then
against torch.distributed's built-ins on real gloo processes.

Block (src -> dst), element j holds 1 + src·10^8 + dst·10^4 + j, so every element of every
output has one known value and a wrong one names where it came from.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from _util import DTYPES, SIM_WORLDS
from conftest import GLOO_WORLDS
from ringcoll.api.common import Context
from ringcoll.api.all_to_all import build_all_to_all, build_all_to_all_single
from ringcoll.sim.engine import ScheduleError, run_plans

ALGORITHMS = ("pairwise", "linear", "bruck")
ANY_SPLITS = ("pairwise", "linear")


def block(src: int, dst: int, rows: int, width: int = 1) -> torch.Tensor:
    """What src sends dst: ``rows`` rows of ``width`` exact, never-zero values."""
    values = 1 + src * 10**8 + dst * 10**4 + torch.arange(rows * width, dtype=torch.int64)
    return values.view(rows, width) if width > 1 else values


def uneven(src: int, dst: int) -> int:
    """Rows src sends dst in the uneven cases: 0 to 4, different each way."""
    return (7 * src + 3 * dst + 1) % 5


def expected_single(rank: int, world: int, rows, width: int = 1) -> torch.Tensor:
    return torch.cat([block(src, rank, rows(src, rank), width) for src in range(world)])


def equal_blocks(world: int, numel: int, *, src: int = None, dst: int = None) -> torch.Tensor:
    """All of src's blocks (its input) or all blocks for dst (its expected output), numel each."""
    peers = torch.arange(world).repeat_interleave(numel)
    j = torch.arange(numel).repeat(world)
    if src is not None:
        return 1 + src * 10**8 + peers * 10**4 + j
    return 1 + peers * 10**8 + dst * 10**4 + j


def sizes(world: int) -> list[int]:
    """Block sizes: 0, 1, world - 1, world + 1, and 1000 (4099 too at a few worlds) up to 17
    ranks; at 32 and 64 ranks 1000 adds nothing the schedules see but seconds of copying."""
    extra = [4099] if world in (3, 8, 13) else []
    large = [1000] if world <= 17 else []
    return sorted({0, 1, max(world - 1, 0), world + 1, *large, *extra})


# -- simulator: every algorithm, every world, exact data ---------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world", SIM_WORLDS)
def test_equal_blocks_exact(algorithm, world):
    failures = []
    for numel in sizes(world):
        inputs = [equal_blocks(world, numel, src=src) for src in range(world)]
        saved = [t.clone() for t in inputs]
        sim = ringcoll.simulate("all_to_all_single", algorithm, world,
                                call=lambda r: ((torch.zeros(world * numel, dtype=torch.int64), inputs[r]), {}))
        for rank in range(world):
            want = equal_blocks(world, numel, dst=rank)
            got = sim.outputs[rank][0]
            if not torch.equal(got, want):
                wrong = (got != want).nonzero()[0].item()
                failures.append(f"numel {numel} rank {rank}: element {wrong} is {got[wrong].item()}, "
                                f"want {want[wrong].item()}")
            if not torch.equal(inputs[rank], saved[rank]):
                failures.append(f"numel {numel} rank {rank}: the input was modified")
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("algorithm", ANY_SPLITS)
@pytest.mark.parametrize("world", SIM_WORLDS)
def test_uneven_splits_exact(algorithm, world):
    """Split sizes along dim 0 of 2-D tensors (3 elements a row), some of them 0."""
    def call(rank):
        input = torch.cat([block(rank, dst, uneven(rank, dst), 3) for dst in range(world)])
        output = torch.zeros(sum(uneven(src, rank) for src in range(world)), 3, dtype=torch.int64)
        return (output, input, [uneven(src, rank) for src in range(world)],
                [uneven(rank, dst) for dst in range(world)]), {}

    sim = ringcoll.simulate("all_to_all_single", algorithm, world, call=call)
    for rank in range(world):
        assert torch.equal(sim.outputs[rank][0], expected_single(rank, world, uneven, 3)), f"rank {rank}"


@pytest.mark.parametrize("world", (2, 3, 6, 11))
def test_pairwise_and_linear_interoperate(world):
    """``auto`` lets each rank of an uneven call pick pairwise or linear from its own largest
    block: both post one message per (source, destination) pair, so they mix freely."""
    def plan(rank):
        input = torch.cat([block(rank, dst, uneven(rank, dst), 3) for dst in range(world)])
        output = torch.zeros(sum(uneven(src, rank) for src in range(world)), 3, dtype=torch.int64)
        return build_all_to_all_single(Context(rank, world), output, input,
                                       [uneven(src, rank) for src in range(world)],
                                       [uneven(rank, dst) for dst in range(world)],
                                       algorithm=ANY_SPLITS[rank % 2])

    plans = [plan(rank) for rank in range(world)]
    run_plans(plans)
    for rank in range(world):
        assert torch.equal(plans[rank].result[0], expected_single(rank, world, uneven, 3)), f"rank {rank}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world", (1, 2, 3, 5, 8, 13))
def test_tensor_lists_any_shape_non_contiguous(algorithm, world):
    """The list form: entries of any shape (equal sizes for bruck), non-contiguous on both sides."""
    rows = (lambda s, d: 4) if algorithm == "bruck" else uneven

    def call(rank):
        inputs = [block(rank, dst, rows(rank, dst), 2).t() for dst in range(world)]       # 2 x rows views
        outputs = [torch.zeros(rows(src, rank), 2, dtype=torch.int64).t() for src in range(world)]
        return (outputs, inputs), {}

    sim = ringcoll.simulate("all_to_all", algorithm, world, call=call)
    for rank in range(world):
        for src, got in enumerate(sim.outputs[rank]):
            assert torch.equal(got, block(src, rank, rows(src, rank), 2).t()), f"rank {rank} from {src}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world", (1, 2, 3, 4, 7, 9))
def test_in_place_single_and_aliased_lists(algorithm, world):
    """``all_to_all_single(x, x)``, and lists whose outputs are the inputs or views of one
    tensor: inputs are copied first, so the result is exact (torch's gloo returns wrong data
    for the in-place call). Built and run directly: ``simulate`` copies each argument apart."""
    numel = 5
    xs = [equal_blocks(world, numel, src=src) for src in range(world)]
    run_plans([build_all_to_all_single(Context(r, world), xs[r], xs[r], algorithm=algorithm) for r in range(world)])
    for rank in range(world):
        assert torch.equal(xs[rank], equal_blocks(world, numel, dst=rank)), f"rank {rank}"
    lists = [list(equal_blocks(world, numel, src=src).split(numel)) for src in range(world)]
    run_plans([build_all_to_all(Context(r, world), lists[r], lists[r], algorithm=algorithm) for r in range(world)])
    for rank in range(world):
        assert torch.equal(torch.cat(lists[rank]), equal_blocks(world, numel, dst=rank)), f"rank {rank}"
    # outputs shifted by one block over the same storage: each input overlaps another output
    xs = [torch.cat([equal_blocks(world, numel, src=src), torch.zeros(numel, dtype=torch.int64)]) for src in range(world)]
    run_plans([build_all_to_all(Context(r, world), list(xs[r][numel:].split(numel)), list(xs[r][:-numel].split(numel)),
                                algorithm=algorithm) for r in range(world)])
    for rank in range(world):
        assert torch.equal(xs[rank][numel:], equal_blocks(world, numel, dst=rank)), f"rank {rank}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_dtype_and_complex_bitwise(algorithm):
    world, numel = 6, 7
    for dtype in (*DTYPES, torch.complex64):
        gen = torch.Generator().manual_seed(3)
        inputs = [(torch.randn(world * numel, generator=gen) * 100).to(dtype) if dtype != torch.bool
                  else torch.rand(world * numel, generator=gen) < 0.5 for _ in range(world)]
        sim = ringcoll.simulate("all_to_all_single", algorithm, world,
                                call=lambda r: ((torch.empty_like(inputs[r]), inputs[r]), {}))
        for rank in range(world):
            want = torch.cat([inputs[src][rank * numel:(rank + 1) * numel] for src in range(world)])
            assert torch.equal(sim.outputs[rank][0], want), f"{dtype} rank {rank}"


@pytest.mark.parametrize("world", (2, 5, 8, 16))
def test_steps_messages_and_bytes_follow_the_cost_models(world):
    numel, size = 10, 8     # int64
    n = world * numel * size
    stats = {}
    for algorithm in ALGORITHMS:
        sim = ringcoll.simulate("all_to_all_single", algorithm, world, call=lambda r: (
            (torch.empty(world * numel, dtype=torch.int64), equal_blocks(world, numel, src=r)), {}))
        stats[algorithm] = sim.stats
        assert max(r.messages for r in sim.stats.ranks) == sim.cost.alpha, algorithm
        assert max(r.bytes_sent for r in sim.stats.ranks) == pytest.approx(sim.cost.beta), algorithm
    lg = (world - 1).bit_length()
    assert stats["pairwise"].steps == world - 1 and stats["pairwise"].messages == world * (world - 1)
    assert stats["linear"].steps == 1 and stats["linear"].messages == world * (world - 1)
    assert stats["bruck"].steps == lg + 1 and stats["bruck"].messages == world * lg
    assert stats["pairwise"].max_bytes_sent == (world - 1) * n // world


def test_mismatched_splits_are_reported_by_the_simulator():
    """Rank 1 expects 3 elements from rank 0, which sends 2: the caller's bug, named."""
    def call(rank):
        if rank == 0:
            return (torch.zeros(3, dtype=torch.int64), torch.arange(1, 4), [1, 2], [1, 2]), {}
        return (torch.zeros(4, dtype=torch.int64), torch.arange(1, 4), [3, 1], [2, 1]), {}

    for algorithm in ANY_SPLITS:
        with pytest.raises(ScheduleError, match="elements"):
            ringcoll.simulate("all_to_all_single", algorithm, 2, call=call)


# -- auto -------------------------------------------------------------------------------------
def chosen(world, numel, *, splits=False, lists=False, algorithm="auto"):
    ctx = Context(0, world)
    if lists:
        plan = build_all_to_all(ctx, [torch.empty(numel) for _ in range(world)],
                                [torch.ones(numel) for _ in range(world)], algorithm=algorithm)
    else:
        split = [numel] * world if splits else None
        plan = build_all_to_all_single(ctx, torch.empty(world * numel), torch.ones(world * numel), split, split,
                                       algorithm=algorithm)
    return plan.algorithm.name


def test_auto_uses_bruck_only_where_the_call_declares_equal_blocks(monkeypatch):
    monkeypatch.delenv("RINGCOLL_ALGO", raising=False)
    assert chosen(16, 8) == "bruck"                      # 32-byte blocks, p >= 8
    assert chosen(4, 8) != "bruck"                       # the table's rule needs p >= 8
    assert chosen(16, 1 << 20) == "pairwise"             # 4 MiB blocks
    # equal by chance is not declared: another rank's blocks may differ, so no bruck
    assert chosen(16, 8, splits=True) == chosen(16, 8, lists=True) != "bruck"
    assert chosen(16, 8, lists=True, algorithm="bruck") == "bruck"
    monkeypatch.setenv("RINGCOLL_ALGO", "all_to_all=bruck")
    assert chosen(4, 1 << 20) == "bruck"
    assert chosen(4, 8, splits=True) == "linear"         # the override cannot force bruck on lists either


# -- bad input: clear errors before anything is touched ---------------------------------------
def test_bad_input_is_refused_before_anything_is_touched():
    ctx = Context(1, 4)
    out, inp = torch.full((8,), 7), torch.arange(1, 9)
    cases = [
        (TypeError, "output", lambda: build_all_to_all_single(ctx, [out], inp)),
        (TypeError, "dtype", lambda: build_all_to_all_single(ctx, out, inp.float())),
        (ValueError, "device", lambda: build_all_to_all_single(ctx, out, torch.ones(8, dtype=torch.int64, device="meta"))),
        (ValueError, "divisible", lambda: build_all_to_all_single(ctx, out[:7], inp[:7])),
        (ValueError, "sum to", lambda: build_all_to_all_single(ctx, out, inp, [2, 2, 2, 2], [1, 2, 3, 1])),
        (ValueError, "one size per rank", lambda: build_all_to_all_single(ctx, out, inp, None, [4, 4])),
        (ValueError, ">= 0", lambda: build_all_to_all_single(ctx, out, inp, None, [4, 4, 4, -4])),
        (TypeError, "int", lambda: build_all_to_all_single(ctx, out, inp, None, [2, 2, 2.0, 2])),
        (TypeError, "list", lambda: build_all_to_all_single(ctx, out, inp, 2, None)),
        (ValueError, "dimension", lambda: build_all_to_all_single(ctx, torch.tensor(1), torch.tensor(2))),
        (ValueError, "bruck", lambda: build_all_to_all_single(ctx, out, inp, [1, 3, 2, 2], [2, 2, 2, 2],
                                                             algorithm="bruck")),
        (ValueError, "one tensor per rank", lambda: build_all_to_all(ctx, [out] * 3, [inp] * 3)),
        (ValueError, "one tensor per rank", lambda: build_all_to_all(ctx, [out] * 4, [inp] * 5)),
        (TypeError, "list", lambda: build_all_to_all(ctx, tuple([out] * 4), [inp] * 4)),
        (TypeError, r"input_tensor_list\[2\]", lambda: build_all_to_all(ctx, [out] * 4, [inp, inp, inp.double(), inp])),
        (TypeError, r"input_tensor_list\[1\]", lambda: build_all_to_all(ctx, [out] * 4, [inp, 3, inp, inp])),
        (ValueError, "bruck", lambda: build_all_to_all(ctx, [out] * 4, [inp, inp, inp[:2], inp], algorithm="bruck")),
        (ValueError, "algorithm", lambda: build_all_to_all(ctx, [out] * 4, [inp] * 4, algorithm="nope")),
        (TypeError, "async_op", lambda: ringcoll.all_to_all_single(out, inp, async_op="1")),
        (TypeError, "group", lambda: ringcoll.all_to_all([out] * 4, [inp] * 4, group="world")),
    ]
    for error, words, call in cases:
        with pytest.raises(error, match=words):
            call()
    assert torch.equal(out, torch.full((8,), 7)) and torch.equal(inp, torch.arange(1, 9))


def test_outside_the_group_returns_none_but_still_checks_arguments():
    outside = Context(None, None)
    assert build_all_to_all_single(outside, torch.empty(3), torch.ones(3)) is None
    assert build_all_to_all(outside, [torch.empty(1)], [torch.ones(1)] * 5) is None
    with pytest.raises(ValueError, match="algorithm"):
        build_all_to_all_single(outside, torch.empty(3), torch.ones(3), algorithm="nope")
    with pytest.raises(TypeError, match="dtype"):
        build_all_to_all_single(outside, torch.empty(3), torch.ones(3, dtype=torch.int32))


# -- real gloo: against torch.distributed --------------------------------------------------
def gloo_data(rank: int, shape, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=gen).to(dtype)


def reference_single(output_like, input, out_splits, in_splits):
    """torch's all_to_all_single; gloo has no int16 ("Invalid scalar type"), so int16 rows
    travel as their bytes (a view: the same bits, the same dim-0 splits)."""
    want = torch.empty_like(output_like)
    if input.dtype == torch.int16:
        dist.all_to_all_single(want.view(torch.uint8), input.view(torch.uint8), out_splits, in_splits)
    else:
        dist.all_to_all_single(want, input, out_splits, in_splits)
    return want


def compare_with_builtin():
    """Every case on this rank against torch's gloo; returns the mismatches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = []

    def check(name, got, want):
        if not torch.equal(got, want):
            problems.append(f"rank {rank}: {name}: {got.flatten()[:6].tolist()} != {want.flatten()[:6].tolist()}")

    # every dtype, equal splits, both forms; the algorithms take turns (they only copy, so
    # the dtype matters to the transport alone) and each meets several dtypes
    algorithms = (*ALGORITHMS, "auto")
    for seed, dtype in enumerate(DTYPES):
        input = gloo_data(rank, (world * 3, 2), dtype, seed)
        want = reference_single(input, input, None, None)
        got = torch.empty_like(input)
        ringcoll.all_to_all_single(got, input, algorithm=algorithms[seed % 4])
        check(f"single {dtype} {algorithms[seed % 4]}", got, want)
        outputs = [torch.empty(3, 2, dtype=dtype) for _ in range(world)]
        ringcoll.all_to_all(outputs, list(input.split(3)), algorithm=algorithms[(seed + 1) % 4])
        check(f"list {dtype} {algorithms[(seed + 1) % 4]}", torch.cat(outputs), want)
    # uneven splits (0 to 4 rows each way), rows of 5 elements; sizes 0 and world + 1 rows too
    in_splits = [uneven(rank, dst) for dst in range(world)]
    out_splits = [uneven(src, rank) for src in range(world)]
    for seed, dtype in enumerate((torch.float32, torch.int8)):
        input = gloo_data(rank, (sum(in_splits), 5), dtype, 20 + seed)
        output_like = torch.empty(sum(out_splits), 5, dtype=dtype)
        want = reference_single(output_like, input, out_splits, in_splits)
        for algorithm in ("pairwise", "linear", "auto"):
            got = torch.full_like(output_like, 3)
            ringcoll.all_to_all_single(got, input, out_splits, in_splits, algorithm=algorithm)
            check(f"uneven single {dtype} {algorithm}", got, want)
    for rows in (0, 1, world + 1):
        input = gloo_data(rank, (world * rows,), torch.int32, 40 + rows)
        want = reference_single(input, input, None, None)
        for algorithm in ALGORITHMS:
            got = torch.empty_like(input)
            ringcoll.all_to_all_single(got, input, algorithm=algorithm)
            check(f"{rows} rows {algorithm}", got, want)
    # lists of different sizes: gloo's list form refuses them ("invalid tensor size"), so the
    # reference is its all_to_all_single on the same data, concatenated
    inputs = [gloo_data(rank, (uneven(rank, dst), 2), torch.float64, 50 + dst) for dst in range(world)]
    want = reference_single(torch.empty(sum(out_splits), 2, dtype=torch.float64), torch.cat(inputs),
                            out_splits, in_splits).split(out_splits)
    for algorithm in (*ANY_SPLITS, "auto"):
        got = [torch.zeros(rows, 2, dtype=torch.float64) for rows in out_splits]
        ringcoll.all_to_all(got, inputs, algorithm=algorithm)
        for src in range(world):
            check(f"uneven list {algorithm} from {src}", got[src], want[src])
    # in place: torch's gloo gets it wrong, so the reference is torch out of place
    x = gloo_data(rank, (world * 4,), torch.int64, 60)
    want = reference_single(x, x.clone(), None, None)
    for algorithm in ALGORITHMS:
        y = x.clone()
        ringcoll.all_to_all_single(y, y, algorithm=algorithm)
        check(f"in place {algorithm}", y, want)
    return problems


@pytest.mark.parametrize("world", GLOO_WORLDS)
def test_matches_builtin(clusters, world):
    problems = [p for answer in clusters(world).run(compare_with_builtin) for p in answer]
    assert not problems, "\n".join(problems[:10])


def group_and_async():
    """A sub-group of the even ranks (created on every rank, in the same order), async work,
    and bad input on a live group (refused, nothing sent: the next call still works)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    members = list(range(0, world, 2))
    group = dist.new_group(members)
    out = {}
    input = torch.arange(len(members) * 2, dtype=torch.int64) + 100 * rank + 1
    output = torch.zeros_like(input)
    result = ringcoll.all_to_all_single(output, input, group=group, algorithm="bruck")
    if rank in members:
        want = torch.empty_like(input)
        dist.all_to_all_single(want, input, group=group)
        out["group"] = (result is None, torch.equal(output, want))
    else:
        out["group"] = (result is None, torch.equal(output, torch.zeros_like(input)))
    # async: work handles in call order, results as torch's
    inputs = [torch.arange(world * 3, dtype=torch.float32) + 1000 * rank + k for k in range(3)]
    outputs = [torch.empty_like(t) for t in inputs]
    works = [ringcoll.all_to_all_single(o, i, async_op=True, algorithm=a)
             for o, i, a in zip(outputs, inputs, ALGORITHMS)]
    lists = [torch.empty(3) for _ in range(world)]
    list_work = ringcoll.all_to_all(lists, list(inputs[0].split(3)), async_op=True)
    for work in works:
        work.wait()
    list_work.wait()
    wants = [reference_single(i, i, None, None) for i in inputs]
    out["async"] = (all(isinstance(w, dist.Work) for w in works),
                    all(torch.equal(o, w) for o, w in zip(outputs, wants)),
                    works[0].result()[0] is outputs[0],
                    list_work.result() is lists and torch.equal(torch.cat(lists), wants[0]))
    # refused on a live group; then a call that must still line up on every rank
    errors = []
    for bad in (lambda: ringcoll.all_to_all([output] * (world + 1), [input] * (world + 1)),
                lambda: ringcoll.all_to_all_single(torch.zeros(world + 1), torch.ones(world + 1),
                                                   [1] * world, [2] * world),
                lambda: ringcoll.all_to_all_single(torch.zeros(world), torch.ones(world, dtype=torch.int32)),
                lambda: ringcoll.all_to_all_single(torch.zeros(world * 2), torch.ones(world * 2),
                                                   None, [2 * world] + [0] * (world - 1), algorithm="bruck")):
        try:
            bad()
        except (TypeError, ValueError) as error:
            errors.append(type(error).__name__)
    after = torch.zeros(world, dtype=torch.int64)
    ringcoll.all_to_all_single(after, torch.full((world,), rank + 1, dtype=torch.int64))
    out["bad"] = (errors, after.tolist())
    return out


@pytest.mark.parametrize("world", (4, 5))
def test_sub_group_async_and_bad_input_on_gloo(clusters, world):
    members = list(range(0, world, 2))
    for rank, out in enumerate(clusters(world).run(group_and_async)):
        assert out["group"] == (True, True), f"rank {rank} (members {members}): {out['group']}"
        assert out["async"] == (True, True, True, True), f"rank {rank}: {out['async']}"
        errors, after = out["bad"]
        assert errors == ["ValueError", "ValueError", "TypeError", "ValueError"], f"rank {rank}: {errors}"
        assert after == list(range(1, world + 1)), f"rank {rank}"


@pytest.mark.parametrize("world", [1, 2, 5, 8, 13])
def test_bruck_copies_are_built_on_access_and_match_the_rule(world):
    """Bruck's steps carry their copies as a lazy Copies sequence (O(world) blocks per step
    at a million ranks): its length is its copies' count, it equals their tuple, the clock
    reads no reduction from it, and the copies are the rule's: the own block first, each
    step's received blocks unpacked to their receiver's output on their last move (scratch
    before), then the next step's movers packed from where they are, positions ascending."""
    from ringcoll.schedules.vocabulary import Buf, Copies, Copy, Layout, chunks
    from ringcoll.sim.engine import reduced_bytes

    block, rank = 3, world - 1
    send, recv = tuple(chunks("input", world * block, world)), tuple(chunks("output", world * block, world))
    layout = Layout(world * block, {"send_blocks": send, "recv_blocks": recv})
    steps = list(ringcoll.schedules.registry.get("all_to_all", "bruck").schedule(rank, world, layout))
    where = {i: send[(rank + i) % world] for i in range(world)}
    lg = (world - 1).bit_length()

    def pack(k):
        moved = [i for i in range(world) if i >> k & 1] if k < lg else []
        return [Copy(Buf("send_buf", j * block, (j + 1) * block), where[i]) for j, i in enumerate(moved)]

    want = [[Copy(recv[rank], send[rank]), *pack(0)]]
    for k in range(lg):
        unpack = []
        for j, i in enumerate(i for i in range(world) if i >> k & 1):
            where[i] = recv[(rank - i) % world] if i >> (k + 1) == 0 else Buf("scratch", i * block, (i + 1) * block)
            unpack.append(Copy(where[i], Buf("recv_buf", j * block, (j + 1) * block)))
        want.append(unpack + pack(k + 1))
    assert len(steps) == lg + 1
    for st, copies in zip(steps, want):
        assert isinstance(st.local, Copies) and reduced_bytes(st.local, 8) == 0
        assert len(st.local) == len(copies) and st.local == tuple(copies) and tuple(copies) == st.local
        assert list(st.local) == copies and st.local[-1] == copies[-1]
