"""The algorithm registry: every schedule, by collective and name, with its cost model.

An algorithm is registered with :func:`register` and looked up by the public API, the
simulator and the benchmark alike, so a schedule written once runs everywhere.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, NamedTuple

from .schedule import Layout, Step


class Cost(NamedTuple):
    """α-β-γ cost on the critical path: messages, bytes on the wire, bytes reduced."""

    alpha: float
    beta: float
    gamma: float

    def plus(self, other: "Cost") -> "Cost":
        return Cost(self.alpha + other.alpha, self.beta + other.beta, self.gamma + other.gamma)

    def time(self, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
        return self.alpha * alpha_s + self.beta * beta_s_per_byte + self.gamma * gamma_s_per_byte


@dataclass(frozen=True)
class Algorithm:
    collective: str
    name: str
    schedule: Callable[[int, int, Layout], Iterable[Step]]
    cost: Callable[[int, int], Cost]

    @property
    def doc(self) -> str:
        return (self.schedule.__doc__ or "").strip()


_REGISTRY: Dict[str, Dict[str, Algorithm]] = {}


def register(collective: str, name: str, cost: Callable[[int, int], Cost]):
    """Decorator: file ``schedule(rank, world, layout)`` as ``collective``/``name``.
    ``cost(world, nbytes)`` gives its α-β-γ cost."""

    def decorate(schedule):
        table = _REGISTRY.setdefault(collective, {})
        if name in table:
            raise ValueError(f"algorithm {collective}/{name} is registered twice")
        table[name] = Algorithm(collective, name, schedule, cost)
        return schedule

    return decorate


_loaded = False


def _load() -> None:
    """Import every module of ringcoll.schedules once (each registers its algorithms)."""
    global _loaded
    if _loaded:
        return
    import ringcoll.schedules as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    _loaded = True


def algorithms(collective: str | None = None):
    """Registered algorithm names: a list for one collective, else a dict of every collective."""
    _load()
    if collective is None:
        return {coll: list(table) for coll, table in _REGISTRY.items()}
    if collective not in _REGISTRY:
        raise ValueError(f"collective must be one of {sorted(_REGISTRY)}, got {collective!r}")
    return list(_REGISTRY[collective])


def get(collective: str, name: str) -> Algorithm:
    """The algorithm ``collective``/``name``; ValueError naming the choices if there is none."""
    _load()
    table = _REGISTRY.get(collective)
    if table is None:
        raise ValueError(f"collective must be one of {sorted(_REGISTRY)}, got {collective!r}")
    if name not in table:
        raise ValueError(f"algorithm for {collective} must be 'auto' or one of {sorted(table)}, got {name!r}")
    return table[name]
