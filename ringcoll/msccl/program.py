"""An MSCCL program as a registry entry: its cost in the registry's terms, its schedule, and
the data check that runs it in the simulator before it is registered (used by
:func:`ringcoll.msccl.load` and by ``python -m ringcoll.msccl check``). A wrong result names
the first wrong element with the value the program leaves there, or says the program never
writes it (a run of the compiled steps on chunk names alone knows which chunks it writes)."""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import torch

from ..schedules.registry import Cost, builder_of
from ..sim.check import ResultError
from .ir import Program, expected_chunks
from .mapping import schedule as _schedule
from .to_schedule import Compiled, LocalCopy, aliases

#: the collectives whose result is the same on every rank
REPLICATED = ("all_reduce", "all_gather")



def cost_of(compiled: Compiled):
    """``cost(world, nbytes)`` in the registry's terms: per step, its busiest rank's messages
    (sent or received: one port carries one at a time, each one α), chunks on the wire and
    chunks reduced, each chunk ``nbytes / nchunksperloop`` bytes. Exact on a flat single-port
    machine where each rank sends and receives at most one message a step (a ring's, a
    tree's); where ranks post several, the clock orders them greedily over everyone's ports,
    and takes up to about twice this (tests/msccl: 0.52-0.75x on its random programs)."""
    per = compiled.program.nchunksperloop
    alpha, beta, gamma = compiled.alpha, compiled.beta_chunks, compiled.gamma_chunks

    def cost(world: int, nbytes: int) -> Cost:
        chunk = nbytes / per
        return Cost(alpha, beta * chunk, gamma * chunk)

    cost.__doc__ = f"{alpha} steps, {beta}/{per}·nβ, {gamma}/{per}·nγ"
    return cost


def schedule_of(compiled: Compiled, name: str):
    def run(rank: int, world: int, layout):
        return _schedule(compiled, rank, world, layout)

    program = compiled.program
    run.__name__ = name
    run.__doc__ = (f"MSCCL program {program.name!r} ({program.coll}, {program.ngpus} ranks, "
                   f"nchunksperloop={program.nchunksperloop}, {program.nchannels} channel(s), "
                   f"proto {program.proto}): {compiled.nsteps} steps, {compiled.messages} messages. "
                   f"Runs at world size {program.ngpus} only; sizes that are not a multiple of its "
                   f"chunking run padded.")
    return run


def check_sizes(program: Program) -> Tuple[int, int]:
    """Two sizes (the simulator's numel) for the data check: a multiple of the chunking and
    one that needs padding."""
    n, per = program.ngpus, program.nchunksperloop
    if program.collective == "all_reduce":
        return 2 * per, 2 * per + 1
    return 2 * per, n * (2 * (per // n) + 1)


def float_call(collective: str, world: int, numel: int):
    """A call on random floats, whose sums differ by the order they are added in."""
    from ..api._calls import numel_call

    def call(rank: int):
        args, kwargs = numel_call(builder_of(collective), rank, world, numel, torch.float32, {})
        generator = torch.Generator().manual_seed(1234 + rank)
        filled = []
        for a in args:
            if isinstance(a, torch.Tensor):
                a = torch.rand(a.shape, generator=generator, dtype=torch.float32) * 3 - 1
            filled.append(a)
        return tuple(filled), kwargs
    return call


def data_check(name: str, compiled: Compiled) -> bool:
    """Simulate the registered ``name`` at its world size on exact integer data, at a size its
    chunking divides and one it pads: a wrong element raises :class:`ResultError` (see
    :func:`first_wrong`); return whether a float run gives every rank bitwise the same result
    (True where the collective has no replicated result)."""
    from ..sim.simulate import simulate

    program = compiled.program
    builder, n = builder_of(program.collective), program.ngpus
    for numel in check_sizes(program):
        wrong = first_wrong(name, compiled, numel)
        if wrong is not None:
            raise ResultError(wrong)
    if program.collective not in REPLICATED:
        return True
    sim = simulate(builder, name, world=n, call=float_call(program.collective, n, check_sizes(program)[0]),
                   check=True, record=False)
    first = result_of(sim.outputs[0])
    return all(torch.equal(first.view(torch.int32), result_of(out).view(torch.int32)) for out in sim.outputs[1:])


def _definition(collective: str, inputs: List[torch.Tensor], rank: int, block: int) -> torch.Tensor:
    """Rank ``rank``'s result of ``collective`` on every rank's flat input (blocks of ``block``)."""
    if collective == "all_reduce":
        return sum(inputs[1:], inputs[0].clone())
    if collective == "all_gather":
        return torch.cat(inputs)
    mine = [x[rank * block:(rank + 1) * block] for x in inputs]
    if collective == "reduce_scatter":
        return sum(mine[1:], mine[0].clone())
    return torch.cat(mine)                                   # all_to_all


def first_wrong(name: str, compiled: Compiled, numel: int) -> Optional[str]:
    """Run the registered ``name`` in the simulator on exact, never-zero integer data of
    ``numel`` elements and compare every rank's output with the collective's definition;
    None when all match, else the first wrong element: rank, output chunk (MSCCL's ``o``),
    element, the value the program leaves there and the value the definition gives. An
    element of a chunk the program never writes (or fills only from chunks nothing wrote)
    is said to be so: its memory holds no value of the program's."""
    from ..api._calls import numel_call
    from ..sim.simulate import simulate

    program = compiled.program
    coll, n, builder = program.collective, program.ngpus, builder_of(program.collective)

    def call(rank: int):
        return numel_call(builder, rank, n, numel, torch.int64, {})

    inputs = [call(r)[0][0 if coll == "all_reduce" else 1].reshape(-1).clone() for r in range(n)]
    sim = simulate(builder, name, world=n, call=call, check=False, record=False)
    block = inputs[0].numel() if coll in ("all_reduce", "all_gather") else -(-numel // n)
    per = program.nchunksperloop if coll == "all_reduce" else program.nchunksperloop // n
    chunk = max(1, -(-block // per))
    written, defined = _written(compiled)
    for rank in range(n):
        got, want = result_of(sim.outputs[rank]), _definition(coll, inputs, rank, block)
        elements = torch.arange(got.numel())
        chunks = (elements // block) * per + (elements % block) // chunk     # each element's chunk of o
        # an element with no value of the program's is wrong even where its memory happens to
        # hold the right number
        empty = torch.tensor([_canonical_o(program, rank, int(k)) not in defined[rank] for k in chunks],
                             dtype=torch.bool)
        bad = ((got != want) | empty).nonzero()
        if not len(bad):
            continue
        e = int(bad[0, 0])
        index = int(chunks[e])
        where = _canonical_o(program, rank, index)
        if where not in written[rank]:
            value = "never written"
        elif where not in defined[rank]:
            value = "only ever written from chunks nothing wrote (uninitialised memory)"
        else:
            value = str(got[e].item())
        return (f"{coll}/{name} world {n}: rank {rank} output (o chunk {index}): element {e} is {value}, "
                f"the definition gives {want[e].item()} ({len(bad)} of {got.numel()} elements differ, "
                f"{numel} elements)")
    return None


def _canonical_o(program: Program, rank: int, index: int) -> Tuple[str, int]:
    target = aliases(program, rank).get("o")
    return (target[0], target[1] + index) if target else ("o", index)


def _written(compiled: Compiled) -> Tuple[List[Set[Tuple[str, int]]], List[Set[Tuple[str, int]]]]:
    """Per rank, the chunks (buffer, index) the compiled program writes, and those holding
    data (an input's, or computed only from such): its steps run on chunk names alone, as
    MSCCL's own check runs a program without data."""
    program = compiled.program
    n, coll = program.ngpus, program.collective
    i_chunks, o_chunks = expected_chunks(program)
    written: List[Set[Tuple[str, int]]] = [set() for _ in range(n)]
    defined: List[Set[Tuple[str, int]]] = []
    for rank in range(n):
        have = {("i", k) for k in range(i_chunks)}
        alias = aliases(program, rank)
        # what the call's placement puts in o before the program (mapping.Placement)
        if coll == "all_reduce" or (coll == "all_to_all" and "i" in alias):
            have |= {("o", k) for k in range(o_chunks)}
        if "i" in alias:
            target, base = alias["i"]
            have |= {(target, base + k) for k in range(i_chunks)}
        defined.append(have)

    def cells(region):
        return [(region[0], region[1] + k) for k in range(region[2])]

    for step in range(compiled.nsteps):
        outgoing: Dict[Tuple[int, int], List[List[bool]]] = {}
        for rank in range(n):
            for kind, peer, region in compiled.steps[rank][step].comms:
                if kind == "send":
                    outgoing.setdefault((rank, peer), []).append([c in defined[rank] for c in cells(region)])
        for rank in range(n):
            taken: Dict[int, int] = {}
            for kind, peer, region in compiled.steps[rank][step].comms:
                if kind != "recv":
                    continue
                k = taken[peer] = taken.get(peer, -1) + 1
                for cell, ok in zip(cells(region), outgoing[(peer, rank)][k]):
                    written[rank].add(cell)
                    (defined[rank].add if ok else defined[rank].discard)(cell)
            for op in compiled.steps[rank][step].local:
                if isinstance(op, LocalCopy):
                    sources, targets = [op.src], [op.dst]
                else:
                    sources, targets = [op.dst, *op.srcs], [op.dst] + ([op.out] if op.out is not None else [])
                ok = [all(cells(src)[k] in defined[rank] for src in sources) for k in range(op.dst[2])]
                for target in targets:
                    for cell, good in zip(cells(target), ok):
                        written[rank].add(cell)
                        (defined[rank].add if good else defined[rank].discard)(cell)
    return written, defined


def result_of(output) -> torch.Tensor:
    """A rank's result as one flat tensor (a list of per-rank blocks concatenated)."""
    if isinstance(output, (list, tuple)):
        if len(output) == 1 or not all(isinstance(o, torch.Tensor) for o in output):
            return result_of(output[0])
        return torch.cat([o.reshape(-1) for o in output])
    return output.reshape(-1)
