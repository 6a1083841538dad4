"""``auto``'s model: the candidate with the least simulated time on the group's machine, with
its node layout, at the call's size band (see the package docstring)."""
from __future__ import annotations

from typing import Callable, Optional

from ..schedules import registry
from ..config import read_cached, settings
from ..cost.machine import Machine
from ..runtime.nodes import even_nodes, local_size_from_env, model_local_size

from .tables import segment_bytes, state, table


# -- the model: the least modelled time on the machine --------------------------------------


#: algorithms the model never considers above this world size: one step of p - 1 messages
#: per rank is for small groups (it also needs p - 1 receive buffers)
SMALL_WORLD_ONLY = {"direct": 8}

_machine_cache: dict = {}


def machine(given: Optional[Machine] = None, device=None) -> tuple[Machine, str]:
    """The model's :class:`ringcoll.Machine` and where it came from, first that answers: the
    one the call was given (its group's ``ringcoll.Options(machine=...)``, or the machine
    ``ringcoll.simulate`` runs on: "given machine"); the JSON file
    ``RINGCOLL_MACHINE`` names, read by :meth:`Machine.load` (``Machine.save`` and
    ``ringcoll.fit(...).save(path)`` write one); else the machine of ``device``'s table
    (:func:`table`: :data:`DEFAULT_MACHINE`, or :data:`CUDA_MACHINE`). A file that
    cannot be read or is no Machine is a ValueError naming RINGCOLL_MACHINE and the path."""
    if given is not None:
        if not isinstance(given, Machine):
            raise TypeError(f"machine must be a ringcoll.Machine, got {type(given).__name__}")
        return given, "given machine"
    path = settings().machine
    if not path:
        of = table(device)
        return of.machine, of.source
    return read_cached(_machine_cache, "RINGCOLL_MACHINE", path, _load_machine), path


def _load_machine(path: str) -> Machine:
    try:
        return Machine.load(path)
    except (ValueError, TypeError) as error:        # bad JSON, unknown fields, bad values
        raise ValueError(f"RINGCOLL_MACHINE={path}: not a ringcoll.Machine JSON "
                         f"(ringcoll.Machine.save writes one): {error}") from None


def _model_bytes(collective: str, nbytes: int, world: int) -> int:
    """The n of the cost models from the bytes ``auto`` sees (all_to_all: the largest block,
    the cost models take what one rank sends in all)."""
    return nbytes * world if collective == "all_to_all" else nbytes


#: the largest world whose candidates the model simulates; beyond it their closed forms
#: serve (at the machine's slowest link, ringcoll.Cost.on), as in the study's sweeps: a cold
#: decision of all_reduce at 64 MiB simulates its 10 algorithms in 0.29 s at p = 64 on this
#: 2-core host (1-23 ms at p <= 8), and ~5 s at p = 256
SIMULATE_UP_TO = 64

#: significant bits a size band keeps: bands of a quarter octave (1, 1.25, 1.5, 1.75 × 2^k)
BAND_BITS = 3

_simulated: dict = {}


def size_band(nbytes: int) -> int:
    """The size the model simulates for ``nbytes``: ``nbytes`` with all but its
    :data:`BAND_BITS` leading bits cleared (powers of two and sizes below 2^BAND_BITS stay
    exact), so every size of a quarter-octave band shares one cached decision."""
    drop = max(0, nbytes.bit_length() - BAND_BITS)
    return nbytes >> drop << drop


def model_nodes(world: int, on: Machine, nodes=None) -> Optional[tuple]:
    """The node layout the model simulates the node-aware candidates with: ``nodes`` (a
    tuple, or a function giving one: the group's layout), else the machine's own nodes,
    else RINGCOLL_LOCAL_SIZE's nodes, else None (one node)."""
    if callable(nodes):
        nodes = nodes()
    if nodes is not None:
        nodes = tuple(nodes)
        if len(nodes) != world:
            raise ValueError(f"nodes must give the node of each of the {world} ranks, got {len(nodes)}")
        return nodes
    own = on.nodes(world)       # a 2-level machine's, a GPU cluster's: what simulate runs on
    if own is not None:
        return own
    size = local_size_from_env()
    return even_nodes(world, size) if size is not None else None


#: how the model prices one candidate: (collective, name, world, nbytes, machine, nodes) ->
#: seconds. Plans are built one layer up, so the api sets it when it is imported
#: (:func:`ringcoll.api._calls.simulated_time`: rank 0's plan on the simulator's clock).
_pricer: Optional[Callable] = None


def set_pricer(price: Callable) -> None:
    """Give the model its way to price a candidate (see :data:`_pricer`)."""
    global _pricer
    _pricer = price


def _simulated_time(collective: str, name: str, world: int, n: int, on: Machine,
                    nodes: Optional[tuple]) -> float:
    """Seconds of ``collective``/``name`` on ``on`` at n bytes, as the pricer says; the log
    lines of the plans it builds are hidden (they are the model's, not the user's calls).
    ``auto`` sees bytes, not the dtype: below a few elements per rank, where the element count
    shapes some schedules (empty chunks send nothing), the pick is the one for 4-byte elements."""
    if _pricer is None:
        raise RuntimeError("auto's model prices algorithms with ringcoll.api's plans: import ringcoll")
    outer, state.modelling = getattr(state, "modelling", False), True
    try:
        return _pricer(collective, name, world, n, on, nodes)
    finally:
        state.modelling = outer


def modelled_times(collective: str, nbytes: int, world: int, names,
                   given: Optional[Machine] = None, nodes=None,
                   device=None) -> list[tuple[float, str]]:
    """(time on the model's machine, name) of every candidate, fastest first (ties, to 12
    significant digits: the lowest ``preference`` its registration declares, then the name:
    :func:`ringcoll.schedules.registry.register`). The time is the
    simulator's cost-only run on the machine of :func:`machine` with the node layout of
    :func:`model_nodes` at the size of :func:`size_band` (ports, NICs and both link classes
    priced as the study prices them), or beyond :data:`SIMULATE_UP_TO` ranks the closed form.
    The segments are those of ``device``'s table (:func:`table`). Cached per (collective,
    world, size band, machine, layout, candidates, table)."""
    of = table(device)
    on, _ = machine(given, of.device)
    layout = model_nodes(world, on, nodes)
    band = size_band(_model_bytes(collective, nbytes, world))
    # the settings too: RINGCOLL_SEGMENT changes the pipelined candidates' prices
    key = (collective, world, band, on, layout, tuple(names), registry.loaded_version(), of.device, settings())
    ranked = _simulated.get(key)
    if ranked is not None:
        return list(ranked)
    outer, state.device = getattr(state, "device", None), of.device   # the segments priced
    try:
        ranked = _rank(collective, world, band, on, layout, names)
    finally:
        state.device = outer
    if len(_simulated) >= 4096:         # a long-lived process sweeping sizes: keep it bounded
        _simulated.clear()
    _simulated[key] = tuple(ranked)
    return ranked


def _rank(collective: str, world: int, band: int, on: Machine, layout, names) -> list:
    """(time, name) of every candidate the model may take, fastest first."""
    ranked = []
    for name in names:
        if world > SMALL_WORLD_ONLY.get(name, world):
            continue
        algorithm = registry.get(collective, name)
        if world <= SIMULATE_UP_TO:
            seconds = _simulated_time(collective, name, world, band, on, layout)
        else:
            seconds = registry.model(algorithm, world, band, segment=segment_bytes(collective, name),
                                     local_size=model_local_size(layout)).on(on)
        ranked.append((float(f"{seconds:.12g}"), algorithm.order, name))
    ranked.sort()
    return [(seconds, name) for seconds, _, name in ranked]


def model_choice(collective: str, nbytes: int, world: int, names,
                 given: Optional[Machine] = None, nodes=None, device=None) -> tuple[str, str]:
    """The candidate with the least modelled time (:func:`modelled_times`), and a reason
    naming the machine, how it was priced, and the runner-up with its time."""
    if len(names) == 1:
        return names[0], "auto: the only candidate"
    ranked = modelled_times(collective, nbytes, world, names, given, nodes, device)
    if not ranked:
        return names[0], "auto: no candidate the model may take, first listed"
    (best_time, best), rest = ranked[0], ranked[1:]
    on, source = machine(given, device)
    how = "simulated" if world <= SIMULATE_UP_TO else "closed form"
    band = size_band(_model_bytes(collective, nbytes, world))
    runner_up = f", next {rest[0][1]} {rest[0][0] * 1e6:.4g} us" if rest else ""
    return best, (f"auto: model ({source}): {how} on {on.describe()} at {band} B: "
                  f"{best} {best_time * 1e6:.4g} us{runner_up}")
