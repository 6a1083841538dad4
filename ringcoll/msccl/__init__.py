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


from ..schedules import registry
from .ir import MscclError, Program, parse, read_text
from .export import export
from .to_schedule import Compiled, compile_program
from .program import REPLICATED, cost_of, data_check, schedule_of
from .check import report

__all__ = ["load", "unload", "export", "check", "MscclError", "Loaded", "loaded"]

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
    registry.register(program.collective, name, cost=cost_of(compiled), replace=True,
                      world=program.ngpus, auto=False)(schedule_of(compiled, name))
    try:
        same = data_check(name, compiled)
        if not same and deterministic:
            raise MscclError(f"{name}: the {program.collective} results are not bitwise identical across "
                             f"ranks (ranks reduce in different orders); load(..., deterministic=False) "
                             f"accepts it")
    except BaseException:
        registry.unregister(program.collective, name)
        if previous is not None:
            registry.register(previous.collective, previous.name, previous.cost, replace=True,
                              symmetry=previous.symmetry, world=previous.world, auto=previous.auto,
                              preference=previous.preference, check=False)(previous.schedule)
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
    return report(path_or_text, machine)
