"""``algorithm="auto"``: the one table that picks an algorithm by collective, size and world.

How ``auto`` decides, first source that answers:

1. ``RINGCOLL_ALGO`` overrides everything: ``RINGCOLL_ALGO=ring`` picks ``ring`` wherever the
   collective has one; ``RINGCOLL_ALGO=all_reduce=rabenseifner,broadcast=binomial`` names it
   per collective. A collective it names nothing for (broadcast has no ring) goes on below,
   and its log line says so.
2. ``RINGCOLL_TUNING=table.csv``: the first row of that table (``ringcoll-bench --tune``
   writes it: ``collective,nranks,min_bytes,max_bytes,algorithm``, bytes inclusive) for this
   collective, world size and size.
3. A group with a machine: its ``ringcoll.Options(machine=...)`` (in ``ringcoll.simulate``,
   the ``machine=`` it runs on), else ``RINGCOLL_MACHINE=machine.json`` (a
   ``ringcoll.Machine`` saved by ``Machine.save`` or ``ringcoll.fit(...).save``): the model
   decides (below), on that machine.
4. No machine: the measured rules, :data:`RULES`. They describe the host they were measured
   on (2 shared cores, gloo), not a machine a user names, so they speak only here. Each is
   (collective, largest message in bytes or None for any, world-size condition, algorithm,
   evidence, ``measured_upto``); the first rule of a collective that matches decides if the
   call's world is within what its evidence measured (``world <= measured_upto``).
5. Otherwise the model on :data:`DEFAULT_MACHINE`.

The model: the candidate with the least time in the simulator's cost-only run on the
machine (ports, NICs and both link classes of a hierarchical one, exactly as the study
prices them), with the group's placement for the node-aware candidates
(:func:`group_nodes`), at the size of the call's quarter-octave band (:func:`size_band`),
cached per (collective, world, band, machine, layout, candidates); beyond
:data:`SIMULATE_UP_TO` ranks the closed forms at the machine's slowest link. ``direct`` is
considered only at p <= 8; on a tie the lowest ``preference`` of the registrations wins
(the classic algorithms before newer ones: :func:`ringcoll.schedules.registry.register`).

Per device: a call on CUDA tensors goes by the CUDA table, :data:`TABLES` ``["cuda"]``, and
every other call by gloo's, ``TABLES["cpu"]`` (:func:`table`): each holds the measured rules
(gloo's are :data:`RULES`; none were measured on a GPU yet), the model's default machine
(:data:`DEFAULT_MACHINE`; :data:`CUDA_MACHINE`, NVLink and InfiniBand) and the segment sizes
(:data:`SEGMENTS`; :data:`CUDA_SEGMENTS`). A tuning table's rows may name the device they were
measured on (a sixth column ``device``, ``cpu`` or ``cuda``: ``ringcoll-bench --tune`` writes
it); a row that names one decides only that device's calls, a row without one every call.
``RINGCOLL_MACHINE`` and ``Options(machine=)`` name the machine for every device.

``RINGCOLL_DEBUG=INFO`` logs each call's choice with the source that decided: ``requested``,
``RINGCOLL_ALGO``, ``auto: tuning table file:line``, ``auto: rule measured up to p=4: ...``
or ``auto: model (given machine | machine.json | default machine): simulated on <machine> at
<band> B: <pick> <time> us, next <runner-up> <time> us``.

Where each part lives: :mod:`.tables` (the rules, segments and CUDA table, as data with their
evidence), :mod:`.tuning` (the RINGCOLL_TUNING table), :mod:`.model` (the simulated choice);
this module holds the order above (:func:`choose`) and the settings' checks against the
registry (:func:`checked_settings`).
"""
from __future__ import annotations

import logging
from typing import Optional

from ..schedules import registry
from ..config import configure_logging, settings  # noqa: F401 - configure_logging: ringcoll's own
from ..cost.machine import Machine
from ..runtime.nodes import context_placement

# the selection package's API beside choose(): its tables, the tuning file, the cost model
from .tables import (CUDA_MACHINE, DEFAULT_MACHINE, RULES, SEGMENTS, TABLES, Table,  # noqa: F401
                     segment_bytes, segment_elements, state, table)
from .tuning import load_tuning, tuning_choice
from .model import (SIMULATE_UP_TO, machine, model_choice, modelled_times, set_pricer, size_band)  # noqa: F401

log = logging.getLogger("ringcoll")


class _ModelRunsFilter(logging.Filter):
    """Drops the log lines of the model's own simulations (each plan built logs its choice at
    INFO), in the thread running them only: RINGCOLL_DEBUG=INFO shows the user's calls."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(state, "modelling", False)


log.addFilter(_ModelRunsFilter())


_checked: dict = {}


def checked_settings():
    """The settings of this moment (:func:`ringcoll.config.settings`) with the names they give
    checked against the registry: every RINGCOLL_ALGO entry (an unknown collective, an
    algorithm the named collective lacks, a bare name no collective has: a silent fall-back to
    ``auto`` would hide that the setting does nothing) and every row of the RINGCOLL_TUNING
    table; ValueError naming the variable, the value and the valid names. The group's creation
    and every drop-in call read the settings through here. Cached per (settings, registry
    version), with the algorithms RINGCOLL_ALGO forces (:func:`forced_algorithms`): about a
    microsecond on a repeated call."""
    current = settings()
    key = (current, registry.loaded_version())
    if key in _checked:
        return current
    _check_algo("RINGCOLL_ALGO", current.algo_text, current.algo)
    if current.tuning is not None:
        try:
            load_tuning(current.tuning)
        except ValueError as error:
            message = str(error)
            raise ValueError(message if message.startswith("RINGCOLL_TUNING")
                             else f"RINGCOLL_TUNING={current.tuning}: {message}") from None
    if len(_checked) >= 64:
        _checked.clear()
    _checked[key] = _forced(current)
    return current


def _check_algo(name: str, setting: str, entries) -> None:
    table = registry.algorithms()
    known = sorted({algorithm for names in table.values() for algorithm in names})
    for coll, algorithm in entries:
        if coll is None:
            if algorithm not in known:
                raise ValueError(f"{name}={setting!r} names {algorithm!r}, which no collective has; the "
                                 f"algorithms are {known} (or collective=name, comma-separated)")
        elif coll not in table:
            raise ValueError(f"{name}={setting!r} names the collective {coll!r}; the collectives "
                             f"are {sorted(table)}")
        elif algorithm not in table[coll]:
            raise ValueError(f"{name}={setting!r} names {coll}={algorithm!r}; {coll} has {table[coll]}")


def forced_algorithms(current=None) -> dict:
    """collective -> the algorithm RINGCOLL_ALGO forces on it: the first entry that applies
    (``coll=name`` for that collective, or a bare name the collective has). Worked out once
    per (settings, registry version), when :func:`checked_settings` checks them."""
    current = current if current is not None else checked_settings()
    forced = _checked.get((current, registry.loaded_version()))
    return dict(forced if forced is not None else _forced(current))


def _forced(current) -> dict:
    forced: dict = {}
    for coll, algorithm in current.algo:
        if coll is not None:
            forced.setdefault(coll, algorithm)
            continue
        for collective, names in registry.algorithms().items():
            if algorithm in names:
                forced.setdefault(collective, algorithm)
    return forced


def choose(collective: str, algorithm: str, nbytes: int, world: int,
           exclude: tuple = (), machine: Optional[Machine] = None,
           nodes=None, device=None, current=None) -> tuple[str, str]:
    """The algorithm to run and why: an explicit name (checked), the RINGCOLL_ALGO override,
    else ``auto``: the tuning table (RINGCOLL_TUNING); then, on a group that has a machine
    (``machine``: its ``Options(machine=...)`` or simulate's; else RINGCOLL_MACHINE), the
    least simulated time on that machine (:func:`model_choice`); without one, the first
    matching rule of RULES where that rule was measured, else the least simulated time on
    :data:`DEFAULT_MACHINE`. ``auto`` never picks a name in ``exclude`` (algorithms this call
    cannot run). ``nodes``: each rank's node, as the node-aware schedules will see it, or a
    function giving it (read only when the model decides; None: the machine's nodes, else
    the environment's). ``device`` (``"cuda"``, ``"cpu"``, a torch.device, or None for the
    table being priced, else gloo's) picks the table (:func:`table`): its tuning rows, rules
    and default machine. ``current``: the call's settings as :func:`checked_settings` gave
    them at its entry (a drop-in's call reads them once); None: read them now. The reason
    names the source that decided, for ``RINGCOLL_DEBUG=INFO``."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str, got {type(algorithm).__name__} {algorithm!r}")
    if current is None:     # every call checks: an explicit name does not hide a typo in RINGCOLL_ALGO
        current = checked_settings()
    if algorithm != "auto":
        registry.get(collective, algorithm)          # ValueError naming the choices
        return algorithm, "requested"
    forced = forced_algorithms(current).get(collective) if current.algo else None
    if forced is not None and forced not in exclude:
        return forced, "RINGCOLL_ALGO"
    name, why = _auto(collective, nbytes, world, exclude, machine, nodes, table(device))
    return name, _unforced(collective, forced, current.algo_text) + why


def _unforced(collective: str, forced: Optional[str], setting: str) -> str:
    """What the log says when RINGCOLL_ALGO is set but does not decide this call: a setting
    such as ``ring`` leaves every collective without a ring at ``auto``, which a user reading
    the log would otherwise take for the override having no effect at all."""
    if not setting:
        return ""
    if forced is not None:
        return f"RINGCOLL_ALGO={setting} names {forced}, which this call cannot run; "
    return f"RINGCOLL_ALGO={setting} names no algorithm of {collective}; "


def _auto(collective: str, nbytes: int, world: int, exclude: tuple, given: Optional[Machine],
          nodes, of: "Table") -> tuple[str, str]:
    """``auto``'s choice after the override: the sources of the module docstring, in order,
    from the table ``of`` the call's device."""
    names = [name for name in registry.algorithms(collective)
             if name not in exclude and registry.get(collective, name).auto]
    tuned = tuning_choice(collective, nbytes, world, names, of.device)
    if tuned is not None:
        return tuned
    on, source = machine(given, of.device)
    if source == of.source:
        # no machine given: the rules measured for this device decide where they were measured
        for rule in of.rules:
            if rule.collective == collective and rule.admits(world) and (
                    rule.max_bytes is None or nbytes <= rule.max_bytes) and rule.algorithm in names:
                if rule.measured_upto is not None and world <= rule.measured_upto:
                    return rule.algorithm, f"auto: rule measured up to p={rule.measured_upto}: " \
                                           f"{rule.evidence.split(';')[0]}"
                break       # the rule that would decide was not measured here: the model does
    return model_choice(collective, nbytes, world, names, given, nodes, of.device)


def group_nodes(ctx) -> tuple:
    """The node of every rank of ``ctx``'s group, as its node-aware schedules will see it,
    read from the context (:func:`ringcoll.runtime.nodes.context_placement`): the placement every
    rank of the group agreed at its first collective call, put there by the call's entry,
    else simulate's ``local_size``: the one place ``auto`` reads it (never exchanged here)."""
    return context_placement(ctx)[0]


