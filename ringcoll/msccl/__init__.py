"""MSCCL interop: run any MSCCL-IR algorithm on ringcoll's send/recv, and write ringcoll's
schedules as MSCCL-IR.

MSCCLang programs (microsoft/msccl-tools) and synthesizers (TACCL, TE-CCL) emit an XML,
"MSCCL-IR", that the MSCCL executor inside NCCL/RCCL runs. :func:`load` parses one
(:mod:`.ir`), orders its instructions into ringcoll steps (:mod:`.to_schedule`), checks the
result in the simulator at its world size against the collective's definition, and registers
it as an algorithm of its collective: the drop-ins, the backend's ``Options``,
``RINGCOLL_ALGO``, :func:`ringcoll.simulate`, ``ringcoll-study`` and ``ringcoll-bench --msccl``
then take its name. A loaded algorithm runs only at its world size (other groups get a
ValueError) and ``auto`` never picks it. Sizes that are not a multiple of the program's
chunking run through padding (:mod:`.mapping`). :func:`export` writes the other way.

>>> name = ringcoll.msccl.load("allreduce_ring_8.xml")        # "msccl:allreduce_ring_8"
>>> ringcoll.all_reduce(tensor, algorithm=name)                # on a group of 8 ranks
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .. import registry
from ..registry import Cost
from .ir import MscclError, Program, load_program, parse, read_text
from .mapping import schedule as _schedule
from .export import export  # noqa: E402 - binds the function over the submodule's name
from .to_schedule import Compiled, compile_program

__all__ = ["load", "unload", "export", "check", "MscclError", "Loaded", "loaded"]

#: the collectives whose result is the same on every rank
REPLICATED = ("all_reduce", "all_gather")
#: the drop-in the data check runs each collective through
_BUILDER = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
            "all_to_all": "all_to_all_single", "reduce_scatter": "reduce_scatter_tensor"}


@dataclass
class Loaded:
    """A registered MSCCL program: its name, parsed program, compiled steps, and whether its
    result is bitwise identical on every rank (None: the collective promises no such thing)."""
    name: str
    program: Program
    compiled: Compiled
    deterministic: Optional[bool]

    @property
    def collective(self) -> str:
        return self.program.collective


_LOADED: Dict[Tuple[str, str], Loaded] = {}


def loaded() -> Dict[Tuple[str, str], Loaded]:
    """(collective, name) -> :class:`Loaded`, for every program this process registered."""
    return dict(_LOADED)


def _default_name(source: str, program: Program) -> str:
    text = os.fspath(source)
    if not text.lstrip().startswith("<"):
        base = os.path.basename(text)
        return "msccl:" + (base[:-3] if base.endswith(".gz") else base).rsplit(".", 1)[0]
    return "msccl:" + program.name


def _cost_of(compiled: Compiled):
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


def _schedule_of(compiled: Compiled, name: str):
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


def _check_sizes(program: Program) -> Tuple[int, int]:
    """Two sizes (the simulator's numel) for the data check: a multiple of the chunking and
    one that needs padding."""
    n, per = program.ngpus, program.nchunksperloop
    if program.collective == "all_reduce":
        return 2 * per, 2 * per + 1
    return 2 * per, n * (2 * (per // n) + 1)


def _float_call(collective: str, world: int, numel: int):
    """A call on random floats, whose sums differ by the order they are added in."""
    from ..simulate import numel_call

    def call(rank: int):
        args, kwargs = numel_call(_BUILDER[collective], rank, world, numel, torch.float32, {})
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
    from ..simulate import simulate

    builder, n = _BUILDER[program.collective], program.ngpus
    for numel in _check_sizes(program):
        simulate(builder, name, world=n, numel=numel, dtype=torch.int64, check=True, record=False)
    if program.collective not in REPLICATED:
        return True
    sim = simulate(builder, name, world=n, call=_float_call(program.collective, n, _check_sizes(program)[0]),
                   check=True, record=False)
    first = _result(sim.outputs[0])
    return all(torch.equal(first.view(torch.int32), _result(out).view(torch.int32)) for out in sim.outputs[1:])


def _result(output) -> torch.Tensor:
    while isinstance(output, (list, tuple)):
        output = output[0]
    return output.reshape(-1)


def load(path_or_text, name: Optional[str] = None, *, deterministic: bool = True,
         replace: bool = False) -> str:
    """Parse, check and register the MSCCL-IR algorithm in a file or string; its name.

    The name is ``name``, else ``"msccl:<file stem>"`` (``"msccl:<algo name>"`` for a string).
    Before registering, the program is run in the simulator at its world size on exact data
    (a size its chunking divides and one it pads) and compared with the collective's
    definition: a wrong result raises naming rank and element, and nothing is registered.
    Where the collective promises the same result on every rank (all_reduce, all_gather), a
    float run must give bitwise identical results on all ranks, else a MscclError says so;
    ``deterministic=False`` accepts such a program (``auto`` never picks a loaded program).
    Loading the same XML under the same name again returns the name; another program under a
    registered name is refused unless ``replace=True``. Malformed XML (a missing receive, a
    dependency cycle, a chunk out of range, a wrong rank count ...) raises :class:`MscclError`
    naming the element and the rule.
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__} {deterministic!r}")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise TypeError(f"name must be None or a non-empty str, got {name!r}")
    text = read_text(path_or_text)
    program = parse(text)
    name = name or _default_name(path_or_text, program)
    key = (program.collective, name)
    known = _LOADED.get(key)
    if known is not None and known.program.text == text and not replace:
        return name
    table = registry.algorithms(program.collective)
    if name in table and not replace:
        raise ValueError(f"algorithm {program.collective}/{name} is already registered (load(..., "
                         f"replace=True) re-defines it, name= gives another)")
    compiled = compile_program(program)
    previous = registry.get(program.collective, name) if name in table else None
    registry.register(program.collective, name, cost=_cost_of(compiled), replace=True,
                      world=program.ngpus, auto=False)(_schedule_of(compiled, name))
    try:
        same = data_check(name, program)
        if not same and deterministic:
            raise MscclError(f"{name}: the {program.collective} results are not bitwise identical across "
                             f"ranks (ranks reduce in different orders); load(..., deterministic=False) "
                             f"accepts it")
    except BaseException:
        registry.unregister(program.collective, name)
        if previous is not None:
            registry.register(previous.collective, previous.name, previous.cost, replace=True,
                              symmetry=previous.symmetry, world=previous.world,
                              auto=previous.auto)(previous.schedule)
        raise
    _LOADED[key] = Loaded(name, program, compiled, None if program.collective not in REPLICATED else same)
    return name


def unload(name: str) -> None:
    """Unregister the program :func:`load` registered as ``name`` (ValueError if none)."""
    for key in [k for k in _LOADED if k[1] == name]:
        registry.unregister(*key)
        del _LOADED[key]
        return
    raise ValueError(f"no MSCCL program is loaded as {name!r}; loaded: {sorted(k[1] for k in _LOADED)}")


def check(path_or_text, machine=None) -> dict:
    """What ``python -m ringcoll.msccl check`` prints, as a dict (see :mod:`.__main__`)."""
    from .check import report
    return report(path_or_text, machine)
