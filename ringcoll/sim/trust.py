"""What the simulator vouches for: a registered algorithm's declared cost against its clock
(:func:`cost_mismatches`, the check :func:`ringcoll.register` runs for a schedule defined
outside ringcoll: see :func:`ringcoll.schedules.registry.register`), and the user modules
that register algorithms, imported once per process (:func:`import_module`).

The check runs the schedule cost-only on the default flat single-port machine (where the
declared cost must equal the clock) at a few small world sizes and sizes, and reports each
(world, size) where they differ by more than :data:`TOLERANCE`. The registry sits layers
below the simulator, so this module hands the check down when imported (``import
ringcoll`` imports it).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import List, Sequence

from ..schedules import registry
from ..schedules.registry import TOLERANCE
from ..cost.machine import Machine

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

    from .simulate import simulate

    machine = Machine()
    out = []
    for world in ((algorithm.world,) if algorithm.world is not None else worlds):
        for nbytes in sizes:
            try:
                sim = simulate(registry.builder_of(algorithm.collective), algorithm.name, world,
                               numel=nbytes // 4, dtype=torch.float32, data=False, record=False, machine=machine)
            except Exception as error:          # a schedule that cannot run here: say so, do not refuse  # noqa: BLE001 - a schedule that cannot run here is reported, not refused
                out.append(f"{algorithm.collective}/{algorithm.name} at world {world}, {nbytes} B: "
                           f"could not be simulated ({type(error).__name__}: {error})")
                continue
            clock, declared = sim.stats.time, sim.predicted
            if abs(declared - clock) > tolerance * max(clock, 1e-12):
                out.append(f"{algorithm.collective}/{algorithm.name} at world {world}, {nbytes} B: declared cost "
                           f"{declared * 1e6:.3g} us, the simulator's clock {clock * 1e6:.3g} us "
                           f"({declared / clock if clock else float('inf'):.3g}x)")
    return out


registry.set_cost_check(cost_mismatches)


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
