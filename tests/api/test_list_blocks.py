"""A list argument read or written in place (executor.Blocks) instead of through the
staging copy: when every chunk the schedule names lies within one of the list's tensors and
nothing aliases, against the built-ins on real gloo processes; the aliased lists, which must
stay staged, against the results the staging copy defines."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import ringcoll
from ringcoll.api.common import persistent_plans
from ringcoll.runtime import executor as executor_module
from ringcoll.api import common
from _util import assert_every_rank, assert_no_problems, block, one_thread  # noqa: F401 - autouse


@contextlib.contextmanager
def _decisions():
    """Records, per staged list a call prepares, whether it ran on the tensors themselves."""
    original = executor_module.Blocks.of.__func__
    seen: list = []

    def spy(cls, name, tensors, writes, steps, buffers):
        blocks = original(cls, name, tensors, writes, steps, buffers)
        seen.append(blocks is not None)
        return blocks

    executor_module.Blocks.of = classmethod(spy)
    try:
        yield seen
    finally:
        executor_module.Blocks.of = classmethod(original)


def _separate(numel: int, world: int, base: int = 0) -> list:
    """One tensor per rank, each its own storage (not back to back: staged before Blocks)."""
    return [block(base + r, numel) for r in range(world)]


def direct_lists_match_the_builtins():
    """linear scatter and gather, ring all_gather, ring, pairwise and direct reduce_scatter:
    the list in place, results equal to the built-ins'; binomial scatter and gather, whose
    messages span several blocks, bruck all_gather and recursive-halving reduce_scatter stay
    staged and equal too. Sizes 1 and not divisible, every root class."""
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = []
    for numel in (1, world + 2):
        for root in sorted({0, world - 1}):
            mine = block(rank, numel)
            for algorithm in ringcoll.algorithms("gather"):
                want = _separate(numel, world, 500) if rank == root else None
                dist.gather(mine, want, dst=root)
                got = _separate(numel, world, 900) if rank == root else None
                with _decisions() as seen:
                    ringcoll.gather(mine, got, dst=root, algorithm=algorithm)
                if rank == root and not all(map(torch.equal, got, want)):
                    problems.append(f"gather {algorithm} numel {numel} root {root}")
                if rank == root and algorithm == "linear" and seen != [True]:
                    problems.append(f"gather linear root {root}: list staged ({seen})")
            for algorithm in ringcoll.algorithms("scatter"):
                parts = _separate(numel, world, 300) if rank == root else None
                want = torch.empty(numel, dtype=torch.int64)
                dist.scatter(want, [p.clone() for p in parts] if parts else None, src=root)
                kept = [p.clone() for p in parts] if parts else None
                got = torch.zeros(numel, dtype=torch.int64)
                with _decisions() as seen:
                    ringcoll.scatter(got, parts, src=root, algorithm=algorithm)
                if not torch.equal(got, want):
                    problems.append(f"scatter {algorithm} numel {numel} root {root}")
                if parts and not all(map(torch.equal, parts, kept)):
                    problems.append(f"scatter {algorithm} numel {numel}: the scatter_list changed")
                if rank == root and algorithm == "linear" and seen != [True]:
                    problems.append(f"scatter linear root {root}: list staged ({seen})")
        for algorithm in ringcoll.algorithms("reduce_scatter"):
            parts = _separate(numel, world, 40 + rank)
            kept = [p.clone() for p in parts]
            want = torch.empty(numel, dtype=torch.int64)
            dist.reduce_scatter(want, [p.clone() for p in parts])
            got = torch.zeros(numel, dtype=torch.int64)
            with _decisions() as seen:
                ringcoll.reduce_scatter(got, parts, algorithm=algorithm)
            if not torch.equal(got, want):
                problems.append(f"reduce_scatter {algorithm} numel {numel}")
            if not all(map(torch.equal, parts, kept)):
                problems.append(f"reduce_scatter {algorithm} numel {numel}: the input_list changed")
            if algorithm in ("ring", "pairwise", "direct") and seen != [True]:
                problems.append(f"reduce_scatter {algorithm}: list staged ({seen})")
        for algorithm in ringcoll.algorithms("all_gather"):
            want = _separate(numel, world, 700)
            dist.all_gather(want, mine)
            got = _separate(numel, world, 800)
            with _decisions() as seen:
                ringcoll.all_gather(got, mine, algorithm=algorithm)
            if not all(map(torch.equal, got, want)):
                problems.append(f"all_gather {algorithm} numel {numel}")
            if algorithm == "ring" and seen != [True]:
                problems.append(f"all_gather ring: list staged ({seen})")
    return problems


def test_direct_lists_match_the_builtins(clusters):
    for world in (3, 4):
        assert_no_problems(clusters(world).run(direct_lists_match_the_builtins))


def aliased_lists_stay_staged():
    """Lists whose tensors alias each other or another argument: staged, so each result is
    the one the staging copy defines (the later of two writes to one tensor wins, a send
    reads what the list held when the call began)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    numel, root = 5, 0
    out = {}
    mine = block(rank, numel)
    # gather and all_gather into one tensor repeated: the last rank's block wins
    shared = torch.zeros(numel, dtype=torch.int64)
    with _decisions() as seen:
        ringcoll.gather(mine, [shared] * world if rank == root else None, dst=root, algorithm="linear")
    out["gather into one tensor repeated"] = rank != root or (
        seen == [False] and torch.equal(shared, block(world - 1, numel)))
    shared = torch.zeros(numel, dtype=torch.int64)
    with _decisions() as seen:
        ringcoll.all_gather([shared] * world, mine, algorithm="ring")
    out["all_gather into one tensor repeated"] = seen == [False] and torch.equal(shared, block(world - 1, numel))
    # all_gather whose input is this rank's own (separate) list entry
    got = _separate(numel, world, 40)
    got[rank].copy_(mine)
    with _decisions() as seen:
        ringcoll.all_gather(got, got[rank], algorithm="ring")
    out["all_gather, input in its own entry"] = seen == [False] and all(
        torch.equal(g, block(r, numel)) for r, g in enumerate(got))
    # scatter whose root output is another rank's entry: that rank gets the entry as it was
    parts = _separate(numel, world, 60) if rank == root else None
    target = parts[1] if rank == root else torch.zeros(numel, dtype=torch.int64)
    with _decisions() as seen:
        ringcoll.scatter(target, parts, src=root, algorithm="linear")
    want = block(60 + (root if rank == root else rank), numel)
    out["scatter into another rank's entry"] = torch.equal(target, want) and (rank != root or seen == [False])
    # reduce_scatter with a premul: the staging copy is scaled in place, so it stays staged
    parts = [torch.full((numel,), float(10 * rank + r + 1)) for r in range(world)]
    kept = [p.clone() for p in parts]
    got = torch.zeros(numel)
    with _decisions() as seen:
        ringcoll.reduce_scatter(got, parts, op=dist._make_nccl_premul_sum(2.0), algorithm="pairwise")
    want = 2.0 * sum(10 * r + rank + 1 for r in range(world))
    out["reduce_scatter premul: staged, input kept"] = seen == [] and torch.equal(
        got, torch.full((numel,), want)) and all(map(torch.equal, parts, kept))
    # a strided entry: staged
    strided = [torch.zeros(numel * 2, dtype=torch.int64)[::2] for _ in range(world)]
    with _decisions() as seen:
        ringcoll.all_gather(strided, mine, algorithm="ring")
    out["all_gather into strided entries"] = seen == [False] and all(
        torch.equal(g, block(r, numel)) for r, g in enumerate(strided))
    return out


def test_aliased_lists_stay_staged(clusters):
    assert_every_rank(clusters(3).run(aliased_lists_stay_staged))


def kept_plans_on_direct_lists():
    """A reused plan runs on the list's tensors: new data in them each call is what moves."""
    rank, world = dist.get_rank(), dist.get_world_size()
    executor = common.group_executor(None)
    persistent_plans(executor).clear()
    kept = 0
    got, mine = _separate(4, world, 0), torch.empty(4, dtype=torch.int64)
    parts = _separate(4, world, 0) if rank == 0 else None
    received = torch.zeros(4, dtype=torch.int64)
    ok = True
    for call in range(3):
        mine.fill_(10 * call + rank + 1)
        ringcoll.all_gather(got, mine, algorithm="ring")
        ok &= all(torch.equal(g, torch.full((4,), 10 * call + r + 1, dtype=torch.int64)) for r, g in enumerate(got))
        for r, part in enumerate(parts or []):
            part.fill_(100 * call + r + 1)
        ringcoll.scatter(received, parts, src=0, algorithm="linear")
        ok &= torch.equal(received, torch.full((4,), 100 * call + rank + 1, dtype=torch.int64))
    ok &= len(persistent_plans(executor)) == kept + 2          # one plan each, reused
    return {"reused plans move each call's data": ok}


def test_kept_plans_on_direct_lists(clusters):
    assert_every_rank(clusters(3).run(kept_plans_on_direct_lists))
