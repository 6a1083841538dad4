"""An MSCCL program as a registry entry: its cost in the registry's terms, its schedule, and
the data check that runs it in the simulator before it is registered (used by
:func:`ringcoll.msccl.load` and by ``python -m ringcoll.msccl check``)."""
from __future__ import annotations

from typing import Tuple

import torch

from ..schedules.registry import Cost
from .ir import Program
from .mapping import schedule as _schedule
from .to_schedule import Compiled

#: the collectives whose result is the same on every rank
REPLICATED = ("all_reduce", "all_gather")
#: the drop-in the data check runs each collective through
BUILDER = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
            "all_to_all": "all_to_all_single", "reduce_scatter": "reduce_scatter_tensor"}



def cost_of(compiled: Compiled):
    """``cost(world, nbytes)`` in the registry's terms: the program's steps with transfers,
    and the chunks on the wire and reduced by the busiest rank of each step, each chunk
    ``nbytes / nchunksperloop`` bytes (exact on a flat single-port machine)."""
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
        args, kwargs = numel_call(BUILDER[collective], rank, world, numel, torch.float32, {})
        generator = torch.Generator().manual_seed(1234 + rank)
        filled = []
        for a in args:
            if isinstance(a, torch.Tensor):
                a = torch.rand(a.shape, generator=generator, dtype=torch.float32) * 3 - 1
            filled.append(a)
        return tuple(filled), kwargs
    return call


def data_check(name: str, program: Program) -> bool:
    """Simulate the registered ``name`` at its world size on exact integer data (any wrong
    element raises, naming rank and element), at a size its chunking divides and one it pads;
    return whether a float run gives every rank bitwise the same result (True where the
    collective has no replicated result)."""
    from ..sim.simulate import simulate

    builder, n = BUILDER[program.collective], program.ngpus
    for numel in check_sizes(program):
        simulate(builder, name, world=n, numel=numel, dtype=torch.int64, check=True, record=False)
    if program.collective not in REPLICATED:
        return True
    sim = simulate(builder, name, world=n, call=float_call(program.collective, n, check_sizes(program)[0]),
                   check=True, record=False)
    first = result_of(sim.outputs[0])
    return all(torch.equal(first.view(torch.int32), result_of(out).view(torch.int32)) for out in sim.outputs[1:])


def result_of(output) -> torch.Tensor:
    while isinstance(output, (list, tuple)):
        output = output[0]
    return output.reshape(-1)
