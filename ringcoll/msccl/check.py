"""``python -m ringcoll.msccl check FILE.xml``: what an MSCCL-IR algorithm is and costs.

The program is parsed and ordered (malformed XML stops here, naming element and rule), then
simulated at its world size on exact data against the collective's definition (the first
wrong element is reported, not raised) and on float data for bitwise identity across ranks,
and timed on the given machine's clock.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..schedules import registry
from ..cost.machine import Machine
from .ir import load_program
from .program import REPLICATED, check_sizes, cost_of, first_wrong, float_call, result_of, schedule_of

#: the simulated size when none is given: 1 MiB of float32
DEFAULT_BYTES = 1 << 20


def report(path_or_text, machine: Optional[Machine] = None, nbytes: int = DEFAULT_BYTES) -> dict:
    """collective, ranks, steps, messages, bytes per rank, deterministic, simulated time on
    ``machine`` (default: ringcoll.Machine()) at ``nbytes``, and the first wrong element (None)."""
    from .to_schedule import compile_program
    from ..sim.simulate import simulate

    machine = machine or Machine()
    program = load_program(path_or_text)
    compiled = compile_program(program)
    name = f"msccl-check:{program.name}"
    registry.register(program.collective, name, cost=cost_of(compiled), replace=True,
                      world=program.ngpus, auto=False)(schedule_of(compiled, name))
    builder, n = registry.builder_of(program.collective), program.ngpus
    wrong, identical = None, None
    try:
        for size in check_sizes(program):
            wrong = wrong or first_wrong(name, compiled, size)
        if program.collective in REPLICATED and wrong is None:
            sim = simulate(builder, name, world=n, call=float_call(program.collective, n, 2 * program.nchunksperloop),
                           check=False, record=False)
            first = result_of(sim.outputs[0]).view(torch.int32)
            identical = all(torch.equal(first, result_of(o).view(torch.int32)) for o in sim.outputs[1:])
        numel = max(1, nbytes // 4)
        timed = simulate(builder, name, world=n, numel=numel, dtype=torch.float32, data=False, machine=machine)
    finally:
        registry.unregister(program.collective, name)
    ranks = timed.stats.ranks
    return {"name": program.name, "collective": program.collective, "ranks": n, "steps": compiled.nsteps,
            "messages": compiled.messages, "nbytes": numel * 4,
            "bytes_per_rank": max(r.bytes_sent for r in ranks), "deterministic": identical,
            "time_s": timed.stats.time, "first_wrong": wrong}


def format_report(info: dict) -> str:
    det = {True: "yes (bitwise identical on every rank)", False: "no (ranks differ in bits)",
           None: "n/a (no replicated result)" if info["first_wrong"] is None else "unknown (wrong result)"}
    return "\n".join([
        f"algorithm:      {info['name']}",
        f"collective:     {info['collective']}",
        f"ranks:          {info['ranks']}",
        f"steps:          {info['steps']}",
        f"messages:       {info['messages']}",
        f"bytes per rank: {info['bytes_per_rank']} sent at most, for {info['nbytes']} bytes",
        f"deterministic:  {det[info['deterministic']]}",
        f"simulated time: {info['time_s'] * 1e6:.3f} us",
        f"first wrong:    {info['first_wrong'] or 'none (matches the definition)'}",
    ])
