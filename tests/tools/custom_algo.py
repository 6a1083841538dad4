"""A user's module for ``ringcoll-bench --import``: it registers one all_reduce algorithm,
as code outside ringcoll would (tests/tools/test_bench.py benchmarks it)."""
import ringcoll
from ringcoll.schedules.registry import get
from ringcoll.schedules.trees import relabel


@ringcoll.register("all_reduce", "ring_reversed",
                   cost=lambda world, nbytes, segment=None: get("all_reduce", "ring").cost(world, nbytes, segment))
def all_reduce_ring_reversed(rank, world, layout):
    """The ring all-reduce with the ranks mirrored (rank r plays rank world - 1 - r), so the
    data flows to the left instead of the right. Cost: the ring's."""
    def mirror(r):
        return world - 1 - r

    yield from relabel(get("all_reduce", "ring").schedule(mirror(rank), world, layout), mirror)
