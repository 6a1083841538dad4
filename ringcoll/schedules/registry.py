"""The algorithm registry: every schedule, by collective and name, with its cost model.

An algorithm is registered with :func:`register` (``ringcoll.register``) and looked up by the
public API, the simulator and the benchmark alike, so a schedule written once runs everywhere.
Each collective's algorithms are listed, and ``auto``'s ties broken, by the ``preference`` each
registration declares (:func:`register`), never by the order modules happen to be imported in.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, NamedTuple, Optional

from ..config import settings
from .vocabulary import Layout, Step


class Cost(NamedTuple):
    """α-β-γ cost on the critical path: messages, bytes on the wire, bytes reduced."""

    alpha: float
    beta: float
    gamma: float

    def plus(self, other: "Cost") -> "Cost":
        return Cost(self.alpha + other.alpha, self.beta + other.beta, self.gamma + other.gamma)

    def time(self, alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float = 0.0) -> float:
        return self.alpha * alpha_s + self.beta * beta_s_per_byte + self.gamma * gamma_s_per_byte

    def on(self, machine) -> float:
        """Seconds on a :class:`ringcoll.Machine`, every message at its slowest link's α and β
        (exact on a flat single-port machine)."""
        alpha, beta = machine.worst_link()
        return self.time(alpha, beta, machine.gamma)


@dataclass(frozen=True)
class Algorithm:
    collective: str
    name: str
    schedule: Callable[[int, int, Layout], Iterable[Step]]
    cost: Callable[[int, int], Cost]
    #: ``symmetry(world, layout) -> "rotation" | int period | "xor" | None``: when every rank's
    #: schedule is a representative's with its peers relabelled (see :func:`register`), so a
    #: cost-only simulation may run the representatives for all (ringcoll.sim.engine)
    symmetry: Optional[Callable[[int, Layout], object]] = None
    #: the one world size the algorithm runs at (a loaded MSCCL program), None: any
    world: Optional[int] = None
    #: whether ``algorithm="auto"`` may pick it (False: only when asked for by name)
    auto: bool = True
    #: its place in its collective's list and ``auto``'s tie-break, lowest first (see
    #: :func:`register`); None: after every algorithm that declares one
    preference: Optional[int] = None

    @property
    def order(self) -> tuple:
        """The sort key of the collective's list and of ``auto``'s ties: (preference, name)."""
        return (UNRANKED if self.preference is None else self.preference, self.name)

    def check_world(self, world: int) -> None:
        """ValueError unless the algorithm runs at ``world`` ranks."""
        if self.world is not None and world != self.world:
            raise ValueError(f"algorithm {self.collective}/{self.name} runs at world size {self.world} "
                             f"only, got a group of {world} ranks")

    @property
    def doc(self) -> str:
        return (self.schedule.__doc__ or "").strip()


#: the registry's collective of each drop-in (builder) named otherwise: the single-tensor forms
#: and torch's older names of them run their collective's algorithms. The one copy of this map:
#: the backend's options, the tuning table, the fit, the bounds and the tools read it here.
COLLECTIVE_OF = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
                 "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
                 "all_to_all_single": "all_to_all"}
#: the drop-in a registry collective is simulated and checked through (one flat tensor per rank)
BUILDER_OF = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
              "all_to_all": "all_to_all_single"}


def collective_of(builder: str) -> str:
    """The registry collective whose algorithms the drop-in ``builder`` runs (:data:`COLLECTIVE_OF`;
    a collective's own name is itself)."""
    return COLLECTIVE_OF.get(builder, builder)


def builder_of(collective: str) -> str:
    """The drop-in the registry's ``collective`` is simulated through (:data:`BUILDER_OF`)."""
    return BUILDER_OF.get(collective, collective)


#: the preference of an algorithm registered without one: after every built-in algorithm
UNRANKED = 1000

_REGISTRY: Dict[str, Dict[str, Algorithm]] = {}
#: bumped by every registration: what was chosen or prepared before may no longer hold
version = 0
#: ``check(algorithm) -> [problem, ...]``: the declared cost against the simulator's clock.
#: The simulator sits layers above the registry, so it hands its check down when imported
#: (:func:`ringcoll.sim.trust.cost_mismatches`; ``import ringcoll`` imports it).
_cost_check: Optional[Callable[[Algorithm], list]] = None
#: relative difference between the declared cost and the clock beyond which register warns
TOLERANCE = 0.10


def set_cost_check(check: Callable[[Algorithm], list]) -> None:
    """Give :func:`register` its check of a declared cost (see :data:`_cost_check`)."""
    global _cost_check
    _cost_check = check


def register(collective: str, name: str, cost: Callable[..., Cost], *, replace: bool = False,
             symmetry: Optional[Callable[[int, Layout], object]] = None, world: Optional[int] = None,
             auto: Optional[bool] = None, preference: Optional[int] = None, check: Optional[bool] = None):
    """Decorator: file ``schedule(rank, world, layout)`` as ``collective``/``name``
    (``ringcoll.register``).

    ``cost(world, nbytes)`` gives its α-β-γ cost on a flat single-port machine: α counts the
    messages on the critical path, β its bytes, γ its bytes reduced (the simulator's clock on
    such a machine gives exactly ``cost.time(α, β, γ)`` for regular schedules). A cost that
    depends on the pipelining segment takes it as a keyword, ``cost(world, nbytes,
    segment=None)`` (bytes; None: the segment table's). ``replace=True`` re-defines an
    existing name (a notebook cell run twice); otherwise a second registration is an error.
    ``symmetry(world, layout)`` may say when the schedule is the same on every rank up to a
    relabelling of the peers, with the same sizes and reductions: ``"rotation"`` (rank r's
    is rank 0's with every peer q moved to ``(q + r) % world``), an int period L (rank r's is
    rank r % L's with every peer moved by ``r - r % L``: nodes of L alike), or ``"xor"`` (rank
    0's with every peer moved to ``q ^ r``); None where it is not. Cost-only simulations then
    run ranks 0 .. L - 1 alone for every rank (checked on sampled ranks; tests/sim/test_study.py
    checks every rank). ``world`` fixes the one world size it runs at (other groups get a
    ValueError when they ask for it). ``auto``: whether ``algorithm="auto"`` may pick it;
    by default only ringcoll's own schedules (defined in a ``ringcoll.`` module) join auto,
    and an algorithm registered from anywhere else runs only when asked for by name
    (``algorithm="mine"``, ``RINGCOLL_ALGO``, a tuning table) until registered with
    ``auto=True`` (ringcoll.msccl registers its loaded programs with ``auto=False``).

    ``preference`` (an int, lowest first) places the algorithm in its collective's list
    (:func:`algorithms`) and breaks ``auto``'s ties: where candidates' modelled times are
    equal (to 12 significant digits: at p = 2 a ring, recursive doubling and Bruck are one
    exchange), the lowest preference wins, then the name. ringcoll's own algorithms declare
    theirs: 0-9 the classic ones of a collective (those the measured rules were taken on), in
    the order their module defines them; 10-19 Swing (NSDI '24), 20-29 Bine
    (SC '25), 30-39 direct, 40-49 the node-aware and torus algorithms, 50-59 PAT, 60-69
    NCCL's own (nccl_ring, nccl_tree, nccl_pat). None (a
    user's default): :data:`UNRANKED`, after every built-in one, then by name.

    ``check`` runs the schedule cost-only at 3, 4 and 8 ranks, 1 KiB and 1 MiB on the
    default flat machine and warns (``UserWarning``, naming the algorithm, the world and the
    declared and clock times) where the declared cost is more than 10 % (:data:`TOLERANCE`)
    off the clock, or where the schedule cannot be simulated there. The declared cost is what
    the study's closed forms use beyond the simulated world sizes and what ``auto`` weighs
    when it does not simulate: a cost off by a factor would steer both. By default (``check``
    None) the rule is who registers, not where the schedule is defined: a call of
    ``register`` made from a module outside ringcoll (a user's module, ``__main__``, a
    notebook, a test) is checked, whatever module the schedule comes from, so ringcoll's
    own ring filed again under a new name with a cost of its own is checked too; a call made
    from ringcoll's own modules (``ringcoll`` and ``ringcoll.*``: the catalogue in
    ringcoll.schedules as it is imported, ringcoll.msccl filing a program with the cost it
    derives from it) is not, so importing ringcoll costs no simulation
    (tests/sim/test_study.py checks every built-in cost against the clock).
    ``check=True`` or ``False`` decides either way.

    >>> @ringcoll.register("all_reduce", "mine", cost=lambda p, n: ringcoll.Cost(p - 1, n, n))
    ... def all_reduce_mine(rank, world, layout): ...
    """
    if not isinstance(collective, str) or not isinstance(name, str) or not name:
        raise TypeError(f"collective and name must be non-empty strs, got {collective!r} and {name!r}")
    if not callable(cost):
        raise TypeError(f"cost must be a callable cost(world, nbytes) -> Cost, got {type(cost).__name__}")
    if auto is not None and not isinstance(auto, bool):
        raise TypeError(f"auto must be None or a bool, got {type(auto).__name__} {auto!r}")
    if check is not None and not isinstance(check, bool):
        raise TypeError(f"check must be None or a bool, got {type(check).__name__} {check!r}")
    if preference is not None and (isinstance(preference, bool) or not isinstance(preference, int)):
        raise TypeError(f"preference must be None or an int, got {type(preference).__name__} {preference!r}")

    own = _is_ringcoll(sys._getframe(1).f_globals.get("__name__"))    # who registers (see check)

    def decorate(schedule):
        if not callable(schedule):
            raise TypeError(f"register decorates a schedule function, got {type(schedule).__name__}")
        _load()
        table = _REGISTRY.setdefault(collective, {})
        if name in table and not replace:
            raise ValueError(f"algorithm {collective}/{name} is registered twice "
                             f"(register(..., replace=True) re-defines it)")
        if symmetry is not None and not callable(symmetry):
            raise TypeError(f"symmetry must be a callable symmetry(world, layout) -> 'rotation' | "
                            f"'xor' | None, got {type(symmetry).__name__}")
        global version
        if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
            raise TypeError(f"world must be None or a positive int, got {world!r}")
        joins = is_builtin(schedule) if auto is None else bool(auto)
        table[name] = Algorithm(collective, name, schedule, cost, symmetry, world, joins, preference)
        _REGISTRY[collective] = dict(sorted(table.items(), key=lambda item: item[1].order))
        version += 1
        if check if check is not None else not own:
            _warn_on_cost(_REGISTRY[collective][name])
        return schedule

    return decorate


def _warn_on_cost(algorithm: Algorithm) -> None:
    if _cost_check is None:
        raise RuntimeError("register's cost check runs on ringcoll's simulator: import ringcoll")
    problems = _cost_check(algorithm)
    if problems:
        warnings.warn(f"ringcoll.register: {algorithm.collective}/{algorithm.name}'s declared cost does not "
                      f"match the simulator's clock (more than {TOLERANCE:.0%} off): " + "; ".join(problems),
                      UserWarning, stacklevel=3)


def _is_ringcoll(module: Optional[str]) -> bool:
    """Whether the module named ``module`` is one of ringcoll's own (``ringcoll``, ``ringcoll.*``)."""
    return module == "ringcoll" or (module or "").startswith("ringcoll.")


def is_builtin(schedule) -> bool:
    """Whether ``schedule`` is one of ringcoll's own (defined in a ``ringcoll.`` module)."""
    return _is_ringcoll(getattr(schedule, "__module__", None))


def unregister(collective: str, name: str) -> None:
    """Remove ``collective``/``name`` (ValueError if it is not registered)."""
    get(collective, name)
    global version
    del _REGISTRY[collective][name]
    version += 1


@functools.lru_cache(maxsize=None)
def _takes(cost, keyword: str) -> bool:
    try:
        params = inspect.signature(cost).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def model(algorithm: Algorithm, world: int, nbytes: int, *, segment: int | None = None,
          local_size: int | None = None) -> Cost:
    """``algorithm``'s cost at ``world`` ranks and ``nbytes``, with the segment (bytes) its
    plan pipelines over and the ranks per node, when its cost function takes them (a cost
    of the node-aware algorithms takes ``local_size``; without it, RINGCOLL_LOCAL_SIZE's: the
    schedules' cost functions never read settings themselves)."""
    extra = {}
    if local_size is None and _takes(algorithm.cost, "local_size"):
        local_size = settings().local_size
    if segment is not None and _takes(algorithm.cost, "segment"):
        extra["segment"] = segment
    if local_size is not None and _takes(algorithm.cost, "local_size"):
        extra["local_size"] = local_size
    return Cost(*algorithm.cost(world, nbytes, **extra))


_loaded = False


def _load() -> None:
    """Import every module of ringcoll.schedules once (each registers its algorithms)."""
    global _loaded
    if _loaded:
        return
    _loaded = True          # first: the modules' own @register calls come back here
    import ringcoll.schedules as package

    try:
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    except BaseException:
        _loaded = False
        raise


def loaded_version() -> int:
    """The registry's version once every built-in module has registered (a key part for caches
    of what the registry decides: it changes with every register/unregister)."""
    _load()
    return version


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


def rotation_when_even(world: int, layout: Layout) -> Optional[str]:
    """``symmetry`` of a schedule whose rank r works on chunk (r - step) % world and talks to
    peers at fixed distances: the same on every rank, up to rotation, when the chunks are
    equal (``layout.numel`` a multiple of the world)."""
    return "rotation" if layout.numel % world == 0 else None


def xor_when_even(world: int, layout: Layout) -> Optional[str]:
    """``symmetry`` of a butterfly over ``rank ^ 2^k`` partners: the same on every rank, up to
    ``peer ^ rank``, when the world is a power of two and the chunks are equal."""
    return "xor" if world & (world - 1) == 0 and layout.numel % world == 0 else None
