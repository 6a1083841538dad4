"""``ringcoll.register``: the registry's :func:`ringcoll.schedules.registry.register` plus a check that
an algorithm's declared cost is what the simulator's clock gives.

The cost a user declares is what the study's closed forms use beyond the simulated world
sizes and what ``auto`` weighs when it does not simulate; a cost that is off by a factor
(a ring declared 100× cheaper than it runs) would steer both. So a registration from outside
ringcoll runs the schedule cost-only on the default flat single-port machine (where the
declared cost must equal the clock) at a few small world sizes and sizes, and warns naming
the algorithm, the world, the size and both times wherever they differ by more than
:data:`TOLERANCE`. ringcoll's own schedules are not checked at import (tests/test_study.py
checks every one against the clock), so importing ringcoll costs no simulation.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from typing import Callable, List, Optional, Sequence

from ..schedules import registry
from ..schedules.registry import Cost
from ..schedules.vocabulary import Layout
from ..cost.machine import Machine

#: relative difference between the declared cost and the clock beyond which register warns
TOLERANCE = 0.10
#: the world sizes and message sizes (bytes) a registration is checked at
WORLDS = (3, 4, 8)
SIZES = (1024, 1 << 20)


def cost_mismatches(algorithm: registry.Algorithm, worlds: Sequence[int] = WORLDS,
                    sizes: Sequence[int] = SIZES, tolerance: float = TOLERANCE) -> List[str]:
    """Where ``algorithm``'s declared cost differs from the simulator's clock by more than
    ``tolerance`` (relative to the clock) on the default flat machine: one line per (world,
    size), or one naming the error where the schedule cannot run there. An algorithm fixed to
    one world size is checked at that size."""
    import torch

    from .simulate import BUILDER_OF, simulate

    machine = Machine()
    out = []
    for world in ((algorithm.world,) if algorithm.world is not None else worlds):
        for nbytes in sizes:
            try:
                sim = simulate(BUILDER_OF.get(algorithm.collective, algorithm.collective), algorithm.name, world,
                               numel=nbytes // 4, dtype=torch.float32, data=False, record=False, machine=machine)
            except Exception as error:          # a schedule that cannot run here: say so, do not refuse
                out.append(f"{algorithm.collective}/{algorithm.name} at world {world}, {nbytes} B: "
                           f"could not be simulated ({type(error).__name__}: {error})")
                continue
            clock, declared = sim.stats.time, sim.predicted
            if abs(declared - clock) > tolerance * max(clock, 1e-12):
                out.append(f"{algorithm.collective}/{algorithm.name} at world {world}, {nbytes} B: declared cost "
                           f"{declared * 1e6:.3g} us, the simulator's clock {clock * 1e6:.3g} us "
                           f"({declared / clock if clock else float('inf'):.3g}x)")
    return out


def register(collective: str, name: str, cost: Callable[..., Cost], *, replace: bool = False,
             symmetry: Optional[Callable[[int, Layout], object]] = None, world: Optional[int] = None,
             auto: Optional[bool] = None, check: Optional[bool] = None):
    """Decorator: file ``schedule(rank, world, layout)`` as ``collective``/``name`` (see
    :func:`ringcoll.schedules.registry.register` for ``cost``, ``replace``, ``symmetry`` and ``world``).

    ``auto``: whether ``algorithm="auto"`` may pick it. A user's algorithm does not join auto
    unless registered with ``auto=True``: it runs when asked for by name
    (``algorithm="mine"``, ``RINGCOLL_ALGO``, a tuning table). ``check`` (default: on for
    schedules defined outside ringcoll) runs the schedule cost-only at 3, 4 and 8 ranks, 1 KiB
    and 1 MiB on the default flat machine and warns (``UserWarning``, naming the algorithm,
    the world and the declared and clock times) where the declared cost is more than 10 %
    off the clock, or where the schedule cannot be simulated there.

    >>> @ringcoll.register("all_reduce", "mine", cost=lambda p, n: ringcoll.Cost(p - 1, n, n))
    ... def all_reduce_mine(rank, world, layout): ...
    """
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check must be None or a bool, got {type(check).__name__} {check!r}")
    inner = registry.register(collective, name, cost, replace=replace, symmetry=symmetry, world=world, auto=auto)

    def decorate(schedule):
        inner(schedule)
        if check if check is not None else not registry.is_builtin(schedule):
            problems = cost_mismatches(registry.get(collective, name))
            if problems:
                warnings.warn(f"ringcoll.register: {collective}/{name}'s declared cost does not match the "
                              f"simulator's clock (more than {TOLERANCE:.0%} off): " + "; ".join(problems),
                              UserWarning, stacklevel=2)
        return schedule

    return decorate


def import_module(name: str):
    """The user module ``name``: an importable dotted name, or a path to a ``.py`` file (loaded
    under its file's stem). Imported once per process, so a module that registers algorithms
    with ``ringcoll.register`` registers them once, in the parent and in every rank alike."""
    if name.endswith((".xml", ".xml.gz")):         # ringcoll-bench --msccl: an MSCCL-IR algorithm
        from .. import msccl
        return msccl.load(name)
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = os.path.abspath(name)
    if not os.path.isfile(path):
        raise ImportError(f"no file {path}")
    stem = os.path.splitext(os.path.basename(path))[0]
    loaded = sys.modules.get(stem)
    if loaded is not None:
        if os.path.abspath(getattr(loaded, "__file__", None) or "") == path:
            return loaded
        raise ImportError(f"a module named {stem!r} is already imported from {loaded.__file__!r}")
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[stem]
        raise
    return module
