"""The facts of each collective, one small spec each; the harness owns everything else.

A spec says, for one torch.distributed function: which registry collective its algorithms
come from, the bus-bandwidth factor, how the benchmark size maps to elements, which
variants exist (out-of-place, in-place), and -- in ``setup`` -- how to allocate the buffers,
fill them with exactly predictable data, call the function, and what every rank must hold
afterwards. ringcoll's functions have torch's exact signatures, so one ``call`` serves the
built-in (``torch.distributed.<name>``) and every algorithm (``ringcoll.<name>``).

Words, as nccl-tests: the *size* is the bytes of the largest buffer a rank sees (the
per-rank vector for all_reduce/broadcast/reduce, the gathered total for all_gather/gather,
the scattered total for reduce_scatter/scatter, what one rank sends for all_to_all); a
*chunk* is size / world, the part one rank contributes or receives.

Data: element ``i`` of rank ``r``'s contribution is a small positive integer drawn from a
hash of ``i`` shifted by ``r`` (never zero, never periodic in the chunk size), so every
reduction below is exact in every dtype and a misplaced chunk shows up as wrong elements.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

OUT_OF_PLACE, IN_PLACE = "out-of-place", "in-place"

# --------------------------------------------------------------------------------------
# data with an exactly predictable result


def levels_for(op: Optional[str]) -> int:
    """How many distinct values the data takes, so the reduction by ``op`` stays exact:
    SUM/AVG of values 1..4 stays below 2^8 (bfloat16's exact integers) up to 64 ranks;
    PRODUCT of values 1..2 gives powers of two; copies, MIN/MAX and bitwise ops take 1..100."""
    return {"sum": 4, "avg": 4, "prod": 2}.get(op, 100)


class Pattern:
    """The benchmark's data: ``values(rank, start, stop)`` is rank ``rank``'s element
    ``start..stop`` of a vector whose base is a hash of the element index."""

    def __init__(self, total: int, levels: int, dtype: torch.dtype, device: torch.device):
        index = torch.arange(total, dtype=torch.int64, device=device)
        self._base = ((index * 2654435761) >> 13).remainder_(levels).to(torch.int32)
        self.levels, self.dtype = levels, dtype

    def values(self, rank: int, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        shifted = (self._base[start:stop] + 7 * rank).remainder_(self.levels)
        if self.dtype == torch.bool:
            return shifted.remainder_(2).bool()
        return shifted.add_(1).to(self.dtype)


_ACCUMULATE = {
    "sum": lambda acc, v: acc.logical_or_(v) if acc.dtype == torch.bool else acc.add_(v),
    "avg": lambda acc, v: acc.add_(v),
    "prod": lambda acc, v: acc.logical_and_(v) if acc.dtype == torch.bool else acc.mul_(v),
    "min": lambda acc, v: torch.minimum(acc, v, out=acc),
    "max": lambda acc, v: torch.maximum(acc, v, out=acc),
    "band": lambda acc, v: acc.bitwise_and_(v),
    "bor": lambda acc, v: acc.bitwise_or_(v),
    "bxor": lambda acc, v: acc.bitwise_xor_(v),
}


def reduced(pattern: Pattern, world: int, op: str, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
    """The exact reduction by ``op`` of every rank's ``values(rank, start, stop)``, in the
    dtype (integer overflow wraps, as the collectives do)."""
    acc = pattern.values(0, start, stop).clone()
    for rank in range(1, world):
        _ACCUMULATE[op](acc, pattern.values(rank, start, stop))
    if op == "avg":
        if acc.is_floating_point():
            acc.div_(world)
        else:
            acc.div_(world, rounding_mode="trunc")
    return acc


def count_wrong(actual: torch.Tensor, expected: torch.Tensor, op: Optional[str] = None) -> int:
    """How many elements of ``actual`` differ from ``expected``: exact equality, except AVG
    on floating point (one rounded division), which allows a few units in the last place."""
    if actual.shape != expected.shape:
        return max(actual.numel(), expected.numel())
    if op == "avg" and actual.is_floating_point():
        eps = torch.finfo(actual.dtype).eps
        ok = torch.isclose(actual.double(), expected.double(), rtol=4 * eps, atol=0.0)
        return int((~ok).sum())
    return int((actual != expected).sum())


def spoil(tensor: torch.Tensor, expected: torch.Tensor) -> None:
    """Fill ``tensor`` with values that differ from ``expected`` everywhere, so an element the
    collective forgets to write is counted wrong."""
    if tensor.dtype == torch.bool:
        tensor.copy_(~expected)
    else:
        tensor.copy_(expected)
        tensor.add_(1)


# --------------------------------------------------------------------------------------
# one instance of a collective on this rank


@dataclass(frozen=True)
class Case:
    """What one rank needs to set a collective up: the problem and its own place in it."""

    rank: int
    world: int
    numel: int                  # elements of the size buffer (a multiple of world if chunked)
    dtype: torch.dtype
    device: torch.device
    op: Optional[str]           # "sum", "prod", ... for reducing collectives
    root: int
    variant: str

    @property
    def chunk(self) -> int:
        return self.numel // self.world

    def reduce_op(self):
        return getattr(dist.ReduceOp, {"prod": "PRODUCT"}.get(self.op, self.op.upper()))


@dataclass
class Instance:
    """A collective ready to run on this rank.

    call(fn): one call of ``fn`` (the built-in or ringcoll's, same signature);
    restore: (dst, src) copies done before every timed call -- the inputs the call overwrites;
    expect: (output, expected) pairs that must hold after a call; the check first spoils the
    outputs and restores the inputs, then calls once and counts wrong elements.
    """

    call: Callable[[Callable], object]
    restore: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    expect: List[Tuple[torch.Tensor, Callable[[], torch.Tensor]]] = field(default_factory=list)
    _expected: Optional[list] = field(default=None, repr=False)

    def reset(self) -> None:
        for dst, src in self.restore:
            dst.copy_(src)

    def expected(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(output, expected values) pairs, computed once."""
        if self._expected is None:
            self._expected = [(out, make()) for out, make in self.expect]
        return self._expected

    def check(self, fn: Callable, op: Optional[str]) -> int:
        expected = self.expected()
        self.reset()
        for out, want in expected:
            spoil(out, want)
        self.reset()      # an in-place input may alias an output
        self.call(fn)
        return sum(count_wrong(out, want, op) for out, want in expected)


@dataclass(frozen=True)
class Spec:
    """The facts of one collective (see the module docstring)."""

    name: str                                   # torch.distributed / ringcoll function
    family: Optional[str]                       # registry collective of its algorithms (None: none)
    bus_factor: Callable[[int], float]          # busbw = algbw * bus_factor(world)
    setup: Callable[[Case], Instance]
    variants: Tuple[str, ...] = (OUT_OF_PLACE,)
    reduces: bool = False                       # takes an op
    rooted: bool = False                        # takes a root (src/dst)
    chunked: bool = False                       # the size is split in world chunks
    sized: bool = True                          # barrier is not
    primary: bool = True                        # part of --collective all
    per_rank_count: bool = False                # count = elements per rank (nccl-tests' all_gather, reduce_scatter)
    builtin: Optional[Callable] = None          # the built-in, when it is not torch.distributed.<name>
    #: the collective's own messages by bare point-to-point, same signature (see P2P_FLOOR)
    floor: Optional[Callable] = None
    #: or: the spec whose built-in is this collective's floor, on its own buffers of the same
    #: bytes in the same rounds (the ring-bound collectives: SENDRECV, the wire's ceiling)
    floor_spec: Optional[str] = None

    @property
    def has_floor(self) -> bool:
        """Whether its tables have a ``p2p-floor`` contestant (see P2P_FLOOR)."""
        return self.floor is not None or self.floor_spec is not None

    def count(self, numel: int, world: int) -> int:
        """The table's ``count``: the elements of the size buffer, or, as nccl-tests prints
        all_gather and reduce_scatter, the elements per rank."""
        return numel // world if self.per_rank_count else numel

    def numel(self, size: int, itemsize: int, world: int) -> int:
        """Elements of the size buffer for a requested size in bytes (rounded down to a
        multiple of world when chunked, as nccl-tests does)."""
        if not self.sized:
            return 0
        count = size // itemsize
        return count - count % world if self.chunked else count


def _ring_factor(world: int) -> float:
    return (world - 1) / world


def _all_reduce_factor(world: int) -> float:
    return 2 * (world - 1) / world


def _one(world: int) -> float:
    return 1.0


def _empty(case: Case, numel: int) -> torch.Tensor:
    return torch.empty(numel, dtype=case.dtype, device=case.device)


def _pattern(case: Case, total: int) -> Pattern:
    return Pattern(total, levels_for(case.op), case.dtype, case.device)


# --------------------------------------------------------------------------------------
# the specs, one per torch function


def _all_reduce(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    source = pat.values(case.rank)
    tensor = source.clone()
    op = case.reduce_op()
    return Instance(call=lambda fn: fn(tensor, op), restore=[(tensor, source)],
                    expect=[(tensor, lambda: reduced(pat, case.world, case.op))])


def _broadcast(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    source = pat.values(case.rank)      # the root's is the message, the others' is overwritten
    tensor = source.clone()
    return Instance(call=lambda fn: fn(tensor, case.root),
                    restore=[(tensor, source)] if case.rank == case.root else [],
                    expect=[(tensor, lambda: pat.values(case.root))])


def _reduce(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    source = pat.values(case.rank)
    tensor = source.clone()
    op = case.reduce_op()
    expect = [(tensor, lambda: reduced(pat, case.world, case.op))] if case.rank == case.root else []
    return Instance(call=lambda fn: fn(tensor, case.root, op), restore=[(tensor, source)], expect=expect)


def _all_gather_single(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    output = _empty(case, case.numel)
    mine = slice(case.rank * case.chunk, (case.rank + 1) * case.chunk)
    if case.variant == IN_PLACE:
        # nccl-tests' in-place: the input is this rank's chunk of the output
        source = pat.values(case.rank, mine.start, mine.stop)
        data = output[mine]
        restore = [(data, source)]
    else:
        data = pat.values(case.rank, mine.start, mine.stop)
        restore = []

    def expected():
        return torch.cat([pat.values(r, r * case.chunk, (r + 1) * case.chunk) for r in range(case.world)])

    return Instance(call=lambda fn: fn(output, data), restore=restore, expect=[(output, expected)])


def _all_gather(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    outputs = [_empty(case, case.chunk) for _ in range(case.world)]
    data = pat.values(case.rank, case.rank * case.chunk, (case.rank + 1) * case.chunk)
    expect = [(outputs[r], (lambda r=r: pat.values(r, r * case.chunk, (r + 1) * case.chunk)))
              for r in range(case.world)]
    return Instance(call=lambda fn: fn(outputs, data), expect=expect)


def _reduce_scatter_single(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    source = pat.values(case.rank)
    data = source.clone()
    mine = slice(case.rank * case.chunk, (case.rank + 1) * case.chunk)
    # in-place: the output is this rank's chunk of the input (nccl-tests' recvbuff offset)
    output = data[mine] if case.variant == IN_PLACE else _empty(case, case.chunk)
    op = case.reduce_op()
    return Instance(call=lambda fn: fn(output, data, op),
                    restore=[(data, source)] if case.variant == IN_PLACE else [],
                    expect=[(output, lambda: reduced(pat, case.world, case.op, mine.start, mine.stop))])


def _reduce_scatter(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    inputs = [pat.values(case.rank, r * case.chunk, (r + 1) * case.chunk) for r in range(case.world)]
    output = _empty(case, case.chunk)
    op = case.reduce_op()
    mine = (case.rank * case.chunk, (case.rank + 1) * case.chunk)
    return Instance(call=lambda fn: fn(output, inputs, op),
                    expect=[(output, lambda: reduced(pat, case.world, case.op, *mine))])


def _all_to_all_single(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    data = pat.values(case.rank)            # chunk j goes to rank j
    output = _empty(case, case.numel)       # chunk j comes from rank j

    def expected():
        return torch.cat([pat.values(r, case.rank * case.chunk, (case.rank + 1) * case.chunk)
                          for r in range(case.world)])

    return Instance(call=lambda fn: fn(output, data), expect=[(output, expected)])


def _all_to_all(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    inputs = [pat.values(case.rank, j * case.chunk, (j + 1) * case.chunk) for j in range(case.world)]
    outputs = [_empty(case, case.chunk) for _ in range(case.world)]
    mine = (case.rank * case.chunk, (case.rank + 1) * case.chunk)
    expect = [(outputs[r], (lambda r=r: pat.values(r, *mine))) for r in range(case.world)]
    return Instance(call=lambda fn: fn(outputs, inputs), expect=expect)


def _gather(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    data = pat.values(case.rank, case.rank * case.chunk, (case.rank + 1) * case.chunk)
    is_root = case.rank == case.root
    outputs = [_empty(case, case.chunk) for _ in range(case.world)] if is_root else None
    expect = [(outputs[r], (lambda r=r: pat.values(r, r * case.chunk, (r + 1) * case.chunk)))
              for r in range(case.world)] if is_root else []
    return Instance(call=lambda fn: fn(data, outputs, case.root), expect=expect)


def _scatter(case: Case) -> Instance:
    pat = _pattern(case, case.numel)
    is_root = case.rank == case.root
    inputs = [pat.values(case.root, j * case.chunk, (j + 1) * case.chunk)
              for j in range(case.world)] if is_root else None
    output = _empty(case, case.chunk)
    mine = (case.rank * case.chunk, (case.rank + 1) * case.chunk)
    return Instance(call=lambda fn: fn(output, inputs, case.root),
                    expect=[(output, lambda: pat.values(case.root, *mine))])


def _barrier(case: Case) -> Instance:
    return Instance(call=lambda fn: fn())


def _sendrecv(case: Case) -> Instance:
    """nccl-tests' sendrecv_perf: rank r sends its vector to r + 1 and receives r - 1's."""
    pat = _pattern(case, case.numel)
    data = pat.values(case.rank)
    received = _empty(case, case.numel)
    right, left = (case.rank + 1) % case.world, (case.rank - 1) % case.world
    return Instance(call=lambda fn: fn(data, right, received, left),
                    expect=[(received, lambda: pat.values(left))])


def builtin_sendrecv(send_tensor, dst, recv_tensor, src, group=None, async_op=False):
    """torch's own exchange, as ``ringcoll.sendrecv``'s signature: one ``batch_isend_irecv``
    of the send and the receive, then wait on both."""
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send_tensor, dst, group),
                                    dist.P2POp(dist.irecv, recv_tensor, src, group)])
    for work in works:
        work.wait()


# --------------------------------------------------------------------------------------
# the point-to-point floors: what no algorithm built on send/recv can avoid


#: the floor contestant, timed in the same rounds as the built-in and the algorithms. Of a
#: collective whose messages its definition fixes (all_to_all: one block per pair of ranks;
#: scatter and gather: one per rank and the root), those messages by bare point-to-point from
#: Python, every one in flight at once, through the same ProcessGroup send/recv ringcoll's gloo
#: transport calls, with no plan, check or tag of a library: an algorithm on this transport
#: that sends these blocks as they are cannot beat it by more than the noise, so its time
#: against the built-in's bounds what such an algorithm can reach. Of a ring-bound collective
#: (all_reduce, all_gather, reduce_scatter): the built-in sendrecv of the same bytes (rank r
#: to r + 1, nccl-tests' sendrecv_perf), whose busbw is the wire's ceiling for their rings.
P2P_FLOOR = "p2p-floor"


def _exchange(sends, recvs, group=None) -> None:
    """Post every ``(tensor, peer)`` send and receive at once on ``group``'s ProcessGroup
    (tag 0), then wait for them all."""
    pg = group if group is not None else dist.group.WORLD
    works = [pg.send([tensor], peer, 0) for tensor, peer in sends]
    works += [pg.recv([tensor], peer, 0) for tensor, peer in recvs]
    for work in works:
        work.wait()


def _pairwise(world: int, rank: int):
    """(send peer, receive peer) of each of the p - 1 exchanges, MPICH's pairwise order."""
    return [((rank + step) % world, (rank - step) % world) for step in range(1, world)]


def p2p_all_to_all(output_tensor_list, input_tensor_list, group=None) -> None:
    """all_to_all's floor: block j of this rank to rank j and rank j's block to this one,
    every exchange at once; the own block copied."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peers = _pairwise(world, rank)
    _exchange([(input_tensor_list[right], right) for right, _ in peers],
              [(output_tensor_list[left], left) for _, left in peers], group)
    output_tensor_list[rank].copy_(input_tensor_list[rank])


def p2p_all_to_all_single(output, input, group=None) -> None:
    """all_to_all_single's floor (equal splits): as :func:`p2p_all_to_all` on the chunks."""
    world = dist.get_world_size(group)
    p2p_all_to_all(list(output.chunk(world)), list(input.chunk(world)), group)


def p2p_scatter(tensor, scatter_list=None, src=0, group=None) -> None:
    """scatter's floor: the root sends block j to rank j, every send at once, and copies its
    own; every other rank receives its block."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank != src:
        _exchange([], [(tensor, src)], group)
        return
    _exchange([(scatter_list[peer], peer) for peer, _ in _pairwise(world, rank)], [], group)
    tensor.copy_(scatter_list[rank])


def p2p_gather(tensor, gather_list=None, dst=0, group=None) -> None:
    """gather's floor: every rank sends its block to the root, which receives them all at
    once and copies its own."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank != dst:
        _exchange([(tensor, dst)], [], group)
        return
    _exchange([], [(gather_list[peer], peer) for _, peer in _pairwise(world, rank)], group)
    gather_list[rank].copy_(tensor)


#: the point-to-point exchange: its busbw is the wire's ceiling for the ring-bound collectives,
#: whose floor it is (Spec.floor_spec)
SENDRECV = "sendrecv"


SPECS: Dict[str, Spec] = {spec.name: spec for spec in (
    Spec("all_reduce", "all_reduce", _all_reduce_factor, _all_reduce, (IN_PLACE,), reduces=True,
         floor_spec=SENDRECV),
    Spec("broadcast", "broadcast", _one, _broadcast, (IN_PLACE,), rooted=True),
    Spec("reduce", "reduce", _one, _reduce, (IN_PLACE,), reduces=True, rooted=True),
    Spec("all_gather_single", "all_gather", _ring_factor, _all_gather_single,
         (OUT_OF_PLACE, IN_PLACE), chunked=True, per_rank_count=True, floor_spec=SENDRECV),
    Spec("reduce_scatter_single", "reduce_scatter", _ring_factor, _reduce_scatter_single,
         (OUT_OF_PLACE, IN_PLACE), reduces=True, chunked=True, per_rank_count=True,
         floor_spec=SENDRECV),
    Spec("all_to_all_single", "all_to_all", _ring_factor, _all_to_all_single, chunked=True,
         floor=p2p_all_to_all_single),
    Spec("gather", "gather", _ring_factor, _gather, rooted=True, chunked=True, floor=p2p_gather),
    Spec("scatter", "scatter", _ring_factor, _scatter, rooted=True, chunked=True, floor=p2p_scatter),
    Spec("barrier", "barrier", _one, _barrier, sized=False),
    Spec(SENDRECV, None, _one, _sendrecv, primary=False, builtin=builtin_sendrecv),
    # the list variants: same facts, tensors in lists
    Spec("all_gather", "all_gather", _ring_factor, _all_gather, chunked=True, primary=False,
         per_rank_count=True, floor_spec=SENDRECV),
    Spec("reduce_scatter", "reduce_scatter", _ring_factor, _reduce_scatter, reduces=True,
         chunked=True, primary=False, per_rank_count=True, floor_spec=SENDRECV),
    # torch 2.13's deprecated names of all_gather_single and reduce_scatter_single, by name only
    Spec("all_gather_into_tensor", "all_gather", _ring_factor, _all_gather_single,
         (OUT_OF_PLACE, IN_PLACE), chunked=True, primary=False, per_rank_count=True,
         floor_spec=SENDRECV),
    Spec("reduce_scatter_tensor", "reduce_scatter", _ring_factor, _reduce_scatter_single,
         (OUT_OF_PLACE, IN_PLACE), reduces=True, chunked=True, primary=False, per_rank_count=True,
         floor_spec=SENDRECV),
    Spec("all_to_all", "all_to_all", _ring_factor, _all_to_all, chunked=True, primary=False,
         floor=p2p_all_to_all),
)}


def family_of(spec: Spec, registered: Dict[str, Sequence[str]]) -> Optional[str]:
    """The registry collective that holds ``spec``'s algorithms: its own name if registered
    (e.g. ``all_gather_single``), else its family (``all_gather``); None if neither."""
    for key in (spec.name, spec.family):
        if key and registered.get(key):
            return key
    return None


def available(registered: Dict[str, Sequence[str]], module) -> List[str]:
    """The specs whose ringcoll function exists and whose algorithms are registered (or that
    have none: sendrecv, one ringcoll contestant)."""
    return [name for name, spec in SPECS.items()
            if hasattr(module, name) and (spec.family is None or family_of(spec, registered) is not None)]
