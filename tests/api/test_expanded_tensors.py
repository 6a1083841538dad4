"""#40 (lesser): an expanded tensor (stride 0 along a dimension) is reduced and broadcast to the exact
values, instead of raising torch's internal "more than one element of the written-to tensor
refers to a single memory location". gloo is no reference
here: it reads an expanded tensor's elements as if contiguous, past the end of its storage
(torch 2.13: a 1-D float tensor expanded 1 -> 4 came out right at 2 ranks; an int64 one
expanded 1 -> 5 at 3 ranks aborted a rank, SIGABRT; a 3x1 expanded to 3x4 aborted its all_reduce
and crashed its broadcast, SIGSEGV), so ringcoll is checked against the exact values."""
from __future__ import annotations


def expanded_calls() -> dict:
    import torch
    import torch.distributed as dist

    import ringcoll

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    calls = (("all_reduce", lambda t: ringcoll.all_reduce(t, algorithm="ring")),
             ("broadcast", lambda t: ringcoll.broadcast(t, src=1)))
    one = torch.tensor([1], dtype=torch.int64)
    column = torch.arange(3, dtype=torch.int64).view(3, 1) + 1
    cases = {"1-d": (lambda: (one + rank).expand(5), (one * world + sum(range(world))).expand(5), (one + 1).expand(5)),
             "2-d": (lambda: (column + 10 * rank).expand(3, 4), (column * world + 10 * sum(range(world))).expand(3, 4),
                     (column + 10).expand(3, 4))}
    for name, (make, reduced, broadcast) in cases.items():
        for (call, ours), exact in zip(calls, (reduced, broadcast)):
            mine = make()
            ours(mine)
            out[f"{name} {call}"] = (mine.tolist(), exact.tolist())
    return out


def test_expanded_tensors_get_the_exact_values(clusters):
    for rank, results in enumerate(clusters(3).run(expanded_calls)):
        assert results, f"rank {rank}: no case ran"
        for case, (mine, exact) in results.items():
            assert mine == exact, f"rank {rank} {case}: ringcoll {mine}, exact {exact}"

