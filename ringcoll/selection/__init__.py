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
prices them), with the group's node layout for the node-aware candidates
(:func:`group_nodes`), at the size of the call's quarter-octave band (:func:`size_band`),
cached per (collective, world, band, machine, layout, candidates); beyond
:data:`SIMULATE_UP_TO` ranks the closed forms at the machine's slowest link. ``direct`` is
considered only at p <= 8; on a tie the classic algorithm wins over a newer one.

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
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from ..schedules import registry
from ..schedules.vocabulary import DEFAULT_SEGMENT_BYTES
from ..config import configure_logging, settings  # noqa: F401 - configure_logging: ringcoll's own
from ..sim.machine import Machine
from ..runtime.nodes import context_layout, even_nodes, local_size_from_env, model_local_size

log = logging.getLogger("ringcoll")


class _ModelRunsFilter(logging.Filter):
    """Drops the log lines of the model's own simulations (each plan built logs its choice at
    INFO), in the thread running them only: RINGCOLL_DEBUG=INFO shows the user's calls."""

    def __init__(self):
        super().__init__()
        self.state = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.state, "modelling", False)


_model_runs = _ModelRunsFilter()
log.addFilter(_model_runs)


def _any_world(world: int) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    collective: str
    max_bytes: Optional[int]
    algorithm: str
    evidence: str
    world: Callable[[int], bool] = _any_world
    #: the largest world size its evidence measured: the rule decides only up to there.
    #: None: a default from the literature (MPICH), never measured here; the model decides.
    measured_upto: Optional[int] = None


KiB, MiB = 1024, 1024 * 1024

RULES = (
    # Measured 2026-12-02 with ringcoll-bench on this 2-core machine (gloo, float32 SUM, median
    # of 7, time ratio to the built-in in the same run; raw JSON under bench/results/). Here α is
    # a process wake-up (~1 ms with p ranks on 2 cores) and every P2P message pays a rendezvous,
    # so fewer, larger messages win; ±15 % is run-to-run noise at one size.
    Rule("all_reduce", 1 * MiB, "recursive_doubling",
         "up to 1 MiB: lg p whole-vector exchanges; p=4: 0.39-0.84 of the built-in from 4 KiB to "
         "1 MiB, best of the four at every size; p=3 (with the fold): 0.32-1.07, best at 4 of 5 "
         "sizes.",
         measured_upto=4),
    Rule("all_reduce", None, "rabenseifner",
         "above 1 MiB at powers of two: 2 lg p messages with the ring's bytes; p=4: 1.02-1.09 at "
         "4-16 MiB and 0.87 at 64 MiB, where ring was 0.99-1.45 and recursive doubling 1.16-1.30.",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("all_reduce", None, "ring",
         "above 1 MiB at other p: no fold (Rabenseifner's fold moves 2n more); p=3 at 64 MiB: ring "
         "1.07-1.20 vs rabenseifner 1.41, recursive doubling 1.30, double_binary_tree 1.42.",
         measured_upto=3),
    # all_gather / reduce_scatter / gather / scatter: nbytes is the gathered (scattered) total
    Rule("all_gather", None, "recursive_doubling",
         "powers of two, any size: lg p messages, no fold; p=4 (ringcoll-bench 2026-12-02): 0.48-"
         "0.86 of the built-in from 1 MiB to 64 MiB (ring 0.53-1.20, bruck 0.58-1.16), 0.53-1.12 "
         "below (MPICH stops at 512 KiB; here the ring's p-1 rendezvous cost more).",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("all_gather", 80 * KiB, "bruck",
         "first rule: MPICH's default: other worlds below 80 KiB take Bruck, ⌈lg p⌉ messages at "
         "any p. To be re-measured by ringcoll-bench."),
    Rule("all_gather", None, "ring",
         "MPICH's default above 80 KiB at other p; p=3 (ringcoll-bench 2026-12-02): ring 0.49-"
         "0.97 of the built-in from 1 MiB to 64 MiB, best at 3 of 4 sizes (bruck 0.53-1.03).",
         measured_upto=3),
    Rule("reduce_scatter", None, "recursive_halving",
         "powers of two, any size: lg p messages and no fold; p=4 (ringcoll-bench 2026-12-02): "
         "0.34-0.51 of the built-in (which runs a whole all_reduce) from 1 MiB to 64 MiB, 0.40-0.96 "
         "below; pairwise 0.34-0.89, ring 0.52-0.87.",
         world=lambda world: world & (world - 1) == 0,
         measured_upto=4),
    Rule("reduce_scatter", 512 * KiB, "recursive_halving",
         "first rule: MPICH's default for commutative ops (every ReduceOp): recursive halving "
         "below 512 KiB, lg p messages. To be re-measured by ringcoll-bench."),
    Rule("reduce_scatter", None, "pairwise",
         "MPICH's default above 512 KiB: every block straight to its owner, no fold; p=3 "
         "(ringcoll-bench 2026-12-02): 0.42-0.63 of the built-in from 4 MiB to 64 MiB, best there.",
         measured_upto=3),
    Rule("gather", None, "linear",
         "p <= 8: the root posts every receive at once; p=4 (ringcoll-bench 2026-12-02): linear "
         "1.05-1.59 of the built-in from 4 KiB to 64 MiB, binomial 1.18-2.14 (each tree level "
         "costs a wake-up here).",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("gather", None, "binomial",
         "p > 8: MPICH's default, ⌈lg p⌉ messages on the critical path. Not measured (p > 8 needs "
         "more cores)."),
    Rule("scatter", None, "linear",
         "p <= 8: the root posts every send at once; p=4 (ringcoll-bench 2026-12-02, run "
         "20261202T144510Z_np4): linear 1.40 of the built-in at 1 MiB and up and 1.34 at 64 MiB, "
         "binomial 1.66 and 1.75; 1.65 vs 1.93 up to 64 KiB.",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("scatter", None, "binomial",
         "p > 8: MPICH's default scatter, ⌈lg p⌉ messages on the critical path. Not measured "
         "(p > 8 needs more cores)."),
    # broadcast / reduce: nbytes is the vector. Measured 2026-12-02, gloo on 2 cores (heavily
    # shared: load 15), float32, root 1, median of 7, ms, p=4 / p=8. Broadcast 4 KiB: binomial
    # 5.1 / 6.3, pipelined_chain 4.3 / 8.1, scatter_allgather 10.6 / 32.2, double_binary_tree
    # 7.4 / 36.7; 256 KiB: 6.8 / 27.2, 13.0 / 27.9, 7.9 / 104, 19.6 / 64.3; 4 MiB: 18.2 / 50.8,
    # 119 / 440, 8.5 / 27.6, 41.8 / 253. Reduce 4 KiB: binomial 1.5 / 5.6, rabenseifner 3.2 /
    # 21.1, ring 2.3 / 8.3, double_binary_tree 4.2 / 8.2; 256 KiB: 2.0 / 10.3, 8.5 / 29.0, 5.1 /
    # 79.5, 8.4 / 25.1; 4 MiB: 9.9 / 29.5, 11.9 / 42.3, 116 / 381, 98 / 204. Here α is a process
    # wake-up (~1 ms), so the 64 KiB-segment pipelines pay it per segment and lose.
    Rule("broadcast", 1 * MiB, "linear",
         "p <= 8, up to 1 MiB: one step (the root's p-1 sends at once) instead of lg p dependent "
         "ones, each a wake-up here; p=4 (ringcoll-bench 2026-12-02, 30 rounds): linear 1.13-1.76 "
         "of the built-in from 1 KiB to 1 MiB, binomial 1.34-2.27 (at p=2 they are one message "
         "alike).",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("broadcast", None, "binomial",
         "p <= 8, above 1 MiB: lg p messages and the fewest bytes in all (p-1)n, which is what two "
         "cores can move; p=4 (ringcoll-bench 2026-12-02): 0.98-1.05 of the built-in from 1 MiB "
         "to 64 MiB, scatter_allgather 0.98-1.57, pipelined_chain 1.07-1.56. Checked against "
         "every committed p=4 run (bench/results/*_np4_gloo.csv with broadcast): at 64 MiB "
         "binomial 0.85 / 0.99 / 0.98 / 0.98 of the built-in (runs 20261202T144510Z, "
         "20261204T012843Z, T033103Z, T154640Z), scatter_allgather 0.94 / 1.08 / 0.94 / 0.91: it "
         "wins 2 of 4 (in T033103Z bine, 0.84, beat both) and loses 2, and in T154640Z their "
         "p10-p90 overlap (41-59 ms vs 43-58); at 16 MiB binomial 1.03 / 1.00 / 1.08 / 1.05, "
         "scatter_allgather 1.13 / 1.09 / 1.04 / 1.09. Not a case for a switch; linear (0.94 / "
         "0.97 / 0.97 at 64 MiB in the last three) neither.",
         world=lambda world: world <= 8,
         measured_upto=4),
    Rule("broadcast", 256 * KiB, "binomial",
         "p > 8, up to 256 KiB: lg p messages (MPICH: binomial below 12 KiB or p < 8). Not "
         "measured (p > 8 needs more cores)."),
    Rule("broadcast", None, "scatter_allgather",
         "p > 8, above 256 KiB: 2(p-1)/p·n on the wire instead of lg p·n (MPICH's long-message "
         "broadcast). Not measured (p > 8 needs more cores)."),
    Rule("reduce", None, "binomial",
         "p <= 8: binomial measured fastest at every size; 2026-12-02 (comment above), 4 KiB to "
         "4 MiB, at p=4 and 8 (4 MiB: 9.9 ms vs rabenseifner 11.9 at p=4, 29.5 vs 42.3 at p=8). "
         "To be re-measured by ringcoll-bench.",
         world=lambda world: world <= 8,
         measured_upto=8),
    Rule("reduce", 64 * KiB, "binomial",
         "p > 8, up to 64 KiB: α-bound, lg p messages; the α-β-γ models cross between 12 and 64 "
         "KiB at α = 5 µs, 10 GB/s. Not measured (p > 8 needs more cores). To be re-measured by "
         "ringcoll-bench."),
    Rule("reduce", None, "rabenseifner",
         "p > 8, above 64 KiB: 2(p-1)/p·n on the wire and (p-1)/p·n reduced instead of lg p·n "
         "of each; MPICH's reduce_scatter_gather for long vectors. Not measured (p > 8 needs "
         "more cores). To be re-measured by ringcoll-bench."),
    # all_to_all: bytes = the largest block (what one rank sends to one peer), as MPICH's
    # thresholds. Bruck needs every rank to run it, so the builder skips its rule (taking the
    # next that matches) unless the call declares equal blocks (all_to_all_single, splits None).
    Rule("all_to_all", 256, "bruck",
         "blocks <= 256 B at p >= 8: ⌈lg p⌉ messages instead of p-1 (MPICH's short-message rule); "
         "measured 2026-12-02, gloo on 2 cores, p=8, median of 15: 8 B blocks bruck 11.8 ms vs "
         "linear 10.1 vs pairwise 31.4, 64 B 17.2 vs 18.4 vs 30.6 (a tie with linear here, where "
         "α is process wake-ups; the lg p advantage grows with p). To be re-measured by ringcoll-bench.",
         world=lambda world: world >= 8,
         measured_upto=8),
    Rule("all_to_all", 256 * KiB, "linear",
         "blocks <= 256 KiB: all p-1 exchanges in flight at once (MPICH's medium-message "
         "isend/irecv); measured 2026-12-02, gloo on 2 cores, median of 15: linear 1.2-3x faster "
         "than pairwise at p=4 and 8 for every block from 8 B to 256 KiB (p=8, 4 KiB: 19.8 ms vs "
         "33.3; 256 KiB: 15.4 vs 33.4). To be re-measured by ringcoll-bench.",
         measured_upto=8),
    Rule("all_to_all", None, "pairwise",
         "blocks > 256 KiB: one exchange in flight per step bounds the memory and contention "
         "(MPICH's long-message choice); measured 2026-12-02, gloo on 2 cores, median of 7, p=8: "
         "1 MiB blocks pairwise 57.8 ms vs linear 60.4, 4 MiB 147 vs 252 (at p=4 linear still led: "
         "35 vs 69 ms at 4 MiB). To be re-measured by ringcoll-bench.",
         measured_upto=8),
    Rule("barrier", None, "dissemination",
         "the only barrier: ⌈lg p⌉ steps at any p, no fold (Hensgen-Finkel-Manber; MPICH's default)."),
)


_checked: dict = {}


def checked_settings():
    """The settings of this moment (:func:`ringcoll.config.settings`) with the names they give
    checked against the registry: every RINGCOLL_ALGO entry (an unknown collective, an
    algorithm the named collective lacks, a bare name no collective has: a silent fall-back to
    ``auto`` would hide that the setting does nothing) and every row of the RINGCOLL_TUNING
    table; ValueError naming the variable, the value and the valid names. The group's creation
    and every drop-in call read the settings through here. Cached per (settings, registry
    version): about a microsecond on a repeated call."""
    current = settings()
    key = (current, registry.version)
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
    _checked[key] = True
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
    (``coll=name`` for that collective, or a bare name the collective has)."""
    current = current if current is not None else checked_settings()
    forced: dict = {}
    for coll, algorithm in current.algo:
        if coll is not None:
            forced.setdefault(coll, algorithm)
            continue
        for collective, names in registry.algorithms().items():
            if algorithm in names:
                forced.setdefault(collective, algorithm)
    return forced


def _override(collective: str) -> Optional[str]:
    """The algorithm ``RINGCOLL_ALGO`` names for ``collective``, if any (checked by
    :func:`checked_settings`: a typo is a ValueError naming the valid names)."""
    current = settings()
    if not current.algo:
        return None
    return forced_algorithms(checked_settings()).get(collective)


def choose(collective: str, algorithm: str, nbytes: int, world: int,
           exclude: tuple = (), machine: Optional[Machine] = None,
           nodes=None, device=None) -> tuple[str, str]:
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
    and default machine. The reason names the source that decided, for
    ``RINGCOLL_DEBUG=INFO``."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str, got {type(algorithm).__name__} {algorithm!r}")
    checked_settings()          # every call: an explicit algorithm does not hide a typo in RINGCOLL_ALGO
    if algorithm != "auto":
        registry.get(collective, algorithm)          # ValueError naming the choices
        return algorithm, "requested"
    forced = _override(collective)
    if forced is not None and forced not in exclude:
        return forced, "RINGCOLL_ALGO"
    name, why = _auto(collective, nbytes, world, exclude, machine, nodes, table(device))
    return name, _unforced(collective, forced) + why


def _unforced(collective: str, forced: Optional[str]) -> str:
    """What the log says when RINGCOLL_ALGO is set but does not decide this call: a setting
    such as ``ring`` leaves every collective without a ring at ``auto``, which a user reading
    the log would otherwise take for the override having no effect at all."""
    setting = settings().algo_text
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
            if rule.collective == collective and rule.world(world) and (
                    rule.max_bytes is None or nbytes <= rule.max_bytes) and rule.algorithm in names:
                if rule.measured_upto is not None and world <= rule.measured_upto:
                    return rule.algorithm, f"auto: rule measured up to p={rule.measured_upto}: " \
                                           f"{rule.evidence.split(';')[0]}"
                break       # the rule that would decide was not measured here: the model does
    return model_choice(collective, nbytes, world, names, given, nodes, of.device)


def group_nodes(ctx) -> tuple:
    """The node of every rank of ``ctx``'s group, as its node-aware schedules will see it:
    simulate's ``local_size``, else the layout every rank of the group agreed
    (:func:`ringcoll.runtime.nodes.context_layout`): the one place ``auto`` asks."""
    return context_layout(ctx)[0]


# -- the tuning table (RINGCOLL_TUNING) ------------------------------------------------------

TUNING_HEADER = ("collective", "nranks", "min_bytes", "max_bytes", "algorithm")
#: the optional sixth column: the device the row was measured on (empty: any device)
TUNING_DEVICES = ("cpu", "cuda")
_TUNING_NAMES = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
                 "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
                 "all_to_all_single": "all_to_all"}


@dataclass(frozen=True)
class TuningRow:
    collective: str
    nranks: int
    min_bytes: int
    max_bytes: int          # inclusive
    algorithm: str
    where: str              # path:line, for the reason
    device: str = ""        # "cpu" or "cuda": decides only that device's calls; "": any


_tuning_cache: dict = {}


def load_tuning(path: str) -> tuple:
    """The rows of a tuning table: a CSV with the header
    ``collective,nranks,min_bytes,max_bytes,algorithm`` and optionally ``device``
    (``ringcoll-bench --tune`` writes it; bytes inclusive, counted as ``auto`` counts them; the
    device ``cpu`` or ``cuda``, or empty for any). ValueError naming the file, line and field
    of anything wrong, an unregistered algorithm included."""
    import csv

    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as error:
        raise ValueError(f"RINGCOLL_TUNING names {path!r}, which cannot be read: {error}") from None
    cached = _tuning_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    rows = []
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = tuple(field.strip() for field in next(reader, ()))
        if header[:5] != TUNING_HEADER:
            raise ValueError(f"{path}: line 1 must be the header {','.join(TUNING_HEADER)}, got {','.join(header)!r}")
        for line, fields in enumerate(reader, 2):
            if not fields or not "".join(fields).strip():
                continue
            if len(fields) < 5:
                raise ValueError(f"{path}:{line}: needs 5 fields ({','.join(TUNING_HEADER)}), got {fields!r}")
            collective = _TUNING_NAMES.get(fields[0].strip(), fields[0].strip())
            numbers = []
            for name, text in zip(TUNING_HEADER[1:4], fields[1:4]):
                try:
                    numbers.append(int(text))
                except ValueError:
                    raise ValueError(f"{path}:{line}: {name} must be an integer, got {text!r}") from None
            algorithm = fields[4].strip()
            if algorithm not in registry.algorithms(collective):       # ValueError for a bad collective
                raise ValueError(f"{path}:{line}: {collective} has no algorithm {algorithm!r}; "
                                 f"it has {registry.algorithms(collective)}")
            device = fields[5].strip() if len(fields) > 5 else ""
            if device and device not in TUNING_DEVICES:
                raise ValueError(f"{path}:{line}: device must be one of {TUNING_DEVICES} or "
                                 f"empty, got {device!r}")
            rows.append(TuningRow(collective, *numbers, algorithm, f"{path}:{line}", device))
    _tuning_cache[path] = (stamp, tuple(rows))
    return tuple(rows)


def tuning_choice(collective: str, nbytes: int, world: int, names,
                  device=None) -> Optional[tuple[str, str]]:
    """The first row of the RINGCOLL_TUNING table for this collective, world, size and device
    (a row naming another device is skipped) whose algorithm the call can run, or None (no
    table, or no row covers the call)."""
    path = settings().tuning
    if not path:
        return None
    device = table(device).device
    for row in load_tuning(path):
        if row.collective == collective and row.nranks == world and row.device in ("", device) \
                and row.min_bytes <= nbytes <= row.max_bytes and row.algorithm in names:
            return row.algorithm, f"auto: tuning table {row.where}"
    return None


# -- the model: the least modelled time on the machine --------------------------------------

#: the machine of the model when neither Options nor RINGCOLL_MACHINE gives one: the
#: simulator's default machine (α = 5 µs per message, 10 GB/s on the wire, 20 GB/s reducing,
#: one port per rank), a modest cluster
DEFAULT_MACHINE = Machine()

#: algorithms the model never considers above this world size: one step of p - 1 messages
#: per rank is for small groups (it also needs p - 1 receive buffers)
SMALL_WORLD_ONLY = {"direct": 8}

#: algorithms added after the measured rules; on a tie in modelled time the classic wins
FRONTIER = ("direct", "swing_latency", "swing_bandwidth", "bine", "pat", "torus2d", "hierarchical")

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
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as error:
        raise ValueError(f"RINGCOLL_MACHINE names {path!r}, which cannot be read: {error}") from None
    cached = _machine_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1], path
    try:
        loaded = Machine.load(path)
    except (ValueError, TypeError) as error:        # bad JSON, unknown fields, bad values
        raise ValueError(f"RINGCOLL_MACHINE={path}: not a ringcoll.Machine JSON "
                         f"(ringcoll.Machine.save writes one): {error}") from None
    except OSError as error:
        raise ValueError(f"RINGCOLL_MACHINE names {path!r}, which cannot be read: {error}") from None
    _machine_cache[path] = (stamp, loaded)
    return loaded, path


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
    if not on.flat:
        return on.nodes(world)
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
    state = _model_runs.state
    outer, state.modelling = getattr(state, "modelling", False), True
    try:
        return _pricer(collective, name, world, n, on, nodes)
    finally:
        state.modelling = outer


def modelled_times(collective: str, nbytes: int, world: int, names,
                   given: Optional[Machine] = None, nodes=None,
                   device=None) -> list[tuple[float, str]]:
    """(time on the model's machine, name) of every candidate, fastest first (ties, to 12
    significant digits: the classic algorithm, then registration order). The time is the
    simulator's cost-only run on the machine of :func:`machine` with the node layout of
    :func:`model_nodes` at the size of :func:`size_band` (ports, NICs and both link classes
    priced as the study prices them), or beyond :data:`SIMULATE_UP_TO` ranks the closed form.
    The segments are those of ``device``'s table (:func:`table`). Cached per (collective,
    world, size band, machine, layout, candidates, table)."""
    of = table(device)
    on, _ = machine(given, of.device)
    layout = model_nodes(world, on, nodes)
    band = size_band(_model_bytes(collective, nbytes, world))
    key = (collective, world, band, on, layout, tuple(names), registry.version, of.device)
    ranked = _simulated.get(key)
    if ranked is not None:
        return list(ranked)
    state = _model_runs.state
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
    for index, name in enumerate(names):
        if world > SMALL_WORLD_ONLY.get(name, world):
            continue
        if world <= SIMULATE_UP_TO:
            seconds = _simulated_time(collective, name, world, band, on, layout)
        else:
            seconds = registry.model(registry.get(collective, name), world, band,
                                     segment=segment_bytes(collective, name),
                                     local_size=model_local_size(layout)).on(on)
        ranked.append((float(f"{seconds:.12g}"), name in FRONTIER, index, name))
    ranked.sort()
    return [(seconds, name) for seconds, _, _, name in ranked]


def model_choice(collective: str, nbytes: int, world: int, names,
                 given: Optional[Machine] = None, nodes=None, device=None) -> tuple[str, str]:
    """The candidate with the least modelled time (:func:`modelled_times`), and a reason
    naming the machine, how it was priced, and the runner-up with its time."""
    if len(names) == 1:
        return names[0], "auto: the only candidate"
    ranked = modelled_times(collective, nbytes, world, names, given, nodes, device)
    if not ranked:
        return names[0], "auto: no candidate the model may take, first registered"
    (best_time, best), rest = ranked[0], ranked[1:]
    on, source = machine(given, device)
    how = "simulated" if world <= SIMULATE_UP_TO else "closed form"
    band = size_band(_model_bytes(collective, nbytes, world))
    runner_up = f", next {rest[0][1]} {rest[0][0] * 1e6:.4g} us" if rest else ""
    return best, (f"auto: model ({source}): {how} on {on.describe()} at {band} B: "
                  f"{best} {best_time * 1e6:.4g} us{runner_up}")


# -- segment sizes of the pipelined algorithms ------------------------------------------

@dataclass(frozen=True)
class SegmentRule:
    collective: str
    algorithm: str
    segment_bytes: int
    evidence: str


SEGMENTS = (
    SegmentRule("all_reduce", "ring", 16 * MiB,
                "gloo's own ring cuts ≤ 1 MiB segments, but here each segment pays a P2P "
                "rendezvous and a wake-up while two cores leave nothing to overlap: ring at 64 MiB "
                "(ringcoll-bench 2026-12-02, time / built-in) p=4: 1.41 with 1 MiB segments, 1.15 "
                "with 4 MiB, 1.04 unsegmented; p=3: 1.35-1.44 with 1 MiB, 1.07-1.10 with 8 MiB, "
                "1.07-1.25 unsegmented."),
)

#: the pipelined algorithms' segment where no rule names one (gloo's ring segment; the trees
#: and chains that use it are not chosen by ``auto`` on this machine): DEFAULT_SEGMENT_BYTES,
#: in the schedule vocabulary, where a schedule called without a builder finds it too


def segment_bytes(collective: Optional[str] = None, algorithm: Optional[str] = None,
                  device=None) -> int:
    """The segment, in bytes, that ``collective``/``algorithm`` pipelines over: the
    ``RINGCOLL_SEGMENT`` environment variable (bytes), else the segment table of ``device``'s
    table (:func:`table`: :data:`SEGMENTS` or :data:`CUDA_SEGMENTS`), else its default."""
    forced = settings().segment
    if forced:
        return forced
    of = table(device)
    return next((rule.segment_bytes for rule in of.segments
                 if rule.collective == collective and rule.algorithm == algorithm),
                of.default_segment)


def segment_elements(collective: str, algorithm: str, element_size: int, device=None) -> int:
    """:func:`segment_bytes` in elements of ``element_size`` bytes (at least one)."""
    return max(1, segment_bytes(collective, algorithm, device) // max(1, element_size))


# -- the CUDA table ------------------------------------------------------------------------
# Nothing has run on a GPU yet: no rule was measured there, and the model decides on a machine
# built from published constants (an H200 node and its fabric, as NCCL's own tuning model
# prices a launch). ``ringcoll-bench --tune`` run on CUDA writes rows marked ``cuda`` that
# override it (RINGCOLL_TUNING), as RINGCOLL_MACHINE does with a fitted machine.

#: One step's fixed cost on CUDA: an NCCL P2P launch plus a hop. NCCL's tuning model
#: (src/graph/tuning.cc) prices a Simple-protocol launch at 8.4 us base latency plus 3.4 us per
#: NVLink hop; across nodes the network hop adds a few us more (InfiniBand NDR's wire latency
#: is ~1-2 us; NCCL's Simple net latency is ~5-15 us depending on version).
CUDA_NVLINK_ALPHA = 10e-6
CUDA_IB_ALPHA = 15e-6
#: NVLink 4 on H200 SXM: 18 links, 900 GB/s both directions = 450 GB/s per direction (NVIDIA
#: H200 datasheet); one P2P stream between two GPUs through NVSwitch can use it all.
CUDA_NVLINK_BETA = 1 / 450e9
#: InfiniBand NDR: 400 Gb/s = 50 GB/s per direction per port; a DGX H200 has 8 ConnectX-7
#: ports for the compute fabric, one per GPU (the NIC ports of a node: 8).
CUDA_IB_BETA = 1 / 50e9
#: Reduction at HBM speed: H200's HBM3e moves 4.8 TB/s, a reduce moves 3 bytes (2 reads, 1
#: write) per byte reduced: 1.6 TB/s of bytes reduced.
CUDA_GAMMA = 1 / 1.6e12

#: the CUDA table's machine: nodes of 8 GPUs on NVLink, 8 NIC ports per node between them
CUDA_MACHINE = Machine.hierarchical(8, intra=(CUDA_NVLINK_ALPHA, CUDA_NVLINK_BETA),
                                    inter=(CUDA_IB_ALPHA, CUDA_IB_BETA), gamma=CUDA_GAMMA,
                                    nic_ports=8)

CUDA_SEGMENTS = (
    SegmentRule("all_reduce", "ring", 64 * MiB,
                "α-β-γ on CUDA_MACHINE (experiments/cuda_segments.py, bench/results/"
                "cuda_segments.txt): the ring's simulated time only falls as segments grow (p = 8 "
                "and 16, 64 MiB to 1 GiB: best at the whole chunk, e.g. p=8 256 MiB 1331 us at 32 "
                "MiB and up, 1751 at 8 MiB, 5671 at 1 MiB): at 1.6 TB/s a reduction hides little "
                "and every segment costs an α (10 us: 4.5 MB of NVLink time). 64 MiB is the best "
                "up to 512 MiB per chunk and bounds the two scratch slots."),
)

#: the pipelined trees' and chains' segment on CUDA (same script): best 2-4 MiB at 16 MiB
#: (p = 8: chain 193 us, both double binary trees at or within 12 % of their best), 8-16
#: MiB at 256 MiB (there 4 MiB costs up to 38 % more; those sizes go to the bandwidth-optimal
#: algorithms anyway).
CUDA_DEFAULT_SEGMENT_BYTES = 4 * MiB


@dataclass(frozen=True)
class Table:
    """What ``auto`` and the pipelines' segments go by on one kind of device."""
    device: str                 # "cpu" (gloo) or "cuda"
    rules: tuple                # measured rules, each speaking up to its measured world
    machine: Machine            # the model's machine when the call names none
    source: str                 # how the reason names that machine
    segments: tuple
    default_segment: int


TABLES = {
    "cpu": Table("cpu", RULES, DEFAULT_MACHINE, "default machine", SEGMENTS,
                 DEFAULT_SEGMENT_BYTES),
    "cuda": Table("cuda", (), CUDA_MACHINE, "CUDA machine", CUDA_SEGMENTS,
                  CUDA_DEFAULT_SEGMENT_BYTES),
}


def table(device=None) -> Table:
    """The table of ``device``: CUDA's for ``"cuda"`` (or a CUDA torch.device), gloo's for any
    other; None: the one whose model is being priced in this thread (the simulations the
    model runs take its segments), else gloo's."""
    if device is None:
        device = getattr(_model_runs.state, "device", None) or "cpu"
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return TABLES["cuda" if kind == "cuda" else "cpu"]
