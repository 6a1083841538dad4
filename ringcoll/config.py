"""Every ``RINGCOLL_*`` setting, read and validated in one place.

    from ringcoll.config import settings
    settings().window            # RINGCOLL_WINDOW, checked; None when unset

:func:`settings` returns a frozen :class:`Settings`: one typed field per environment
variable (:data:`VARIABLES` lists them with their accepted values, default and meaning; the
README's "Settings" table is generated from it by tools/docs_tables.py). Every reader in
ringcoll goes through it, so a value is parsed by one rule and a bad one is a ValueError
naming the variable, the value and what is accepted, wherever it is first read. ``init_process_group("ringcoll")`` (the
backend's ``create``) and every drop-in call read it first, so a bad value fails there, before
anything is touched, and not deep inside a later call.

Why it is re-read on every call: tests and programs set variables between calls (a test sets
``RINGCOLL_SEGMENT`` in the ranks, runs, pops it), and every call must see the environment of
its own moment. Parsing costs tens of microseconds (the machine file above all), so the
parsed Settings are kept by the raw values: a call reads each variable's raw bytes from
``os.environ``'s own dict and the modification times of the files it names, and finds the
Settings parsed for exactly those (about a microsecond). Equal raw values give the same Settings object, so a persistent
plan can hold it in its key (:func:`ringcoll.api.common.run_call`): a plan is reused
only under the settings it was built with.

The names in RINGCOLL_ALGO and in the RINGCOLL_TUNING table are checked against the registry
one layer up, by :func:`ringcoll.selection.checked_settings`, which the group's creation and
every drop-in call read instead of this module's :func:`settings` (settings sit below the
algorithms: reading them never imports the registry).

Importing ringcoll reads nothing that can fail: a bad value must not kill ``import ringcoll``
(nor a launched rank before it can report), it is refused at the group or the call.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Mapping, NamedTuple, Optional, Tuple

from .cost.machine import EXECUTOR_WINDOW

log = logging.getLogger("ringcoll")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: RINGCOLL_DEBUG's level names; a boolean word switches the log on at INFO or off
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}
#: the kernel backends (ringcoll.kernels.BACKENDS; kept here so that reading the settings
#: never imports the kernels)
KERNEL_BACKENDS = ("auto", "cupy", "numba", "torch")
#: the smallest RINGCOLL_SEGMENT accepted, in bytes (RINGCOLL_SEGMENT_FLOOR lowers it). Below a
#: few KiB every segment pays a whole message's latency to move almost nothing: 1-byte segments
#: made a 1 MiB ring all_reduce take 37 s on 4 gloo ranks (issue #40). 4 KiB is a page, four
#: times the smallest chunk gloo's own ring cuts (1 KiB: ``minSize = 256`` floats in
#: gloo/allreduce_ring_chunked.h) and a quarter of the smallest NCCL cuts (16 KiB: its NVLS
#: chunk, halved down to 16384 bytes for small calls, src/enqueue.cc); no rule of ringcoll's
#: segment tables goes below 1 MiB
SEGMENT_FLOOR = 4096


@dataclass(frozen=True, eq=False)
class Settings:
    """The parsed ``RINGCOLL_*`` environment (see :data:`VARIABLES` for each variable).
    ``None`` means "unset": the reader's own default applies (named in VARIABLES). Compared
    by identity: :func:`settings` hands out one object per distinct raw environment."""

    algo: Tuple[Tuple[Optional[str], str], ...]  # RINGCOLL_ALGO's (collective or None, algorithm) entries
    algo_text: str                     # RINGCOLL_ALGO as given ("" when unset)
    check: bool                        # RINGCOLL_CHECK, or TORCH_DISTRIBUTED_DEBUG=DETAIL
    cuda_transport: str                # "nccl" or "gloo"
    debug: Optional[int]               # a logging level, None: no log
    debug_ranks: Optional[FrozenSet[int]]   # ranks that log; None: every rank
    kernels: str                       # one of KERNEL_BACKENDS
    kernel_cache: Optional[str]        # directory of compiled kernels
    local_size: Optional[int]          # ranks per node (RINGCOLL_LOCAL_SIZE)
    group_rank: str                    # torchrun's GROUP_RANK (its node's rank), "" when unset
    machine: Optional[str]             # path of a ringcoll.Machine JSON (read and checked)
    persistent_plans: Optional[int]    # plans kept per group, 0: none
    segment: Optional[int]             # bytes per segment of the pipelined algorithms
    segment_floor: int                 # the smallest RINGCOLL_SEGMENT accepted (bytes)
    timeout: Optional[float]           # seconds a step may wait
    transport: str                     # "auto", "host", "batched" or "streamed"
    tuning: Optional[str]              # path of a tuning table (read and checked)
    window: Optional[int]              # steps in flight


class Variable(NamedTuple):
    """One environment variable as the README's Settings table shows it: its name, what it
    accepts, its default and its meaning (:func:`parse` holds the rule that reads it)."""
    name: str
    accepts: str
    default: str
    meaning: str


def _words(values) -> str:
    return ", ".join(values)


def _error(name: str, text: str, accepted: str) -> ValueError:
    return ValueError(f"{name}={text!r} is not valid: {name} accepts {accepted}")


def parse_bool(name: str, text: str, default: bool = False) -> bool:
    """1/true/yes/on or 0/false/no/off (any case; empty: ``default``); anything else refused:
    a word such as ``false`` must never switch a setting on."""
    word = text.strip().lower()
    if not word:
        return default
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise _error(name, text, f"a boolean: {_words(_TRUE)} or {_words(_FALSE)}")


def _number(name: str, text: str, convert: Callable[[str], float], fits: Callable[[float], bool],
            accepted: str):
    """``text`` converted (empty: None, the reader's default), refused naming ``accepted``
    where it does not convert or does not fit."""
    word = text.strip()
    if not word:
        return None
    try:
        value = convert(word)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise _error(name, text, accepted)
    return value


def parse_int(name: str, text: str, minimum: int, what: str) -> Optional[int]:
    """An integer >= ``minimum`` (empty: None, the reader's default)."""
    bound = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    return _number(name, text, int, lambda value: value >= minimum, f"{bound} ({what})")


def parse_segment(name: str, text: str, floor: int) -> Optional[int]:
    """Bytes per segment, an integer >= ``floor`` (empty: None, the segment tables); a smaller
    one is refused naming the floor and the variable that lowers it (:data:`SEGMENT_FLOOR`)."""
    value = parse_int(name, text, 1, "bytes per segment")
    if value is not None and value < floor:
        raise ValueError(f"{name}={text.strip()!r} is below the floor of {floor} bytes: {name} accepts an "
                         f"integer >= {floor} (bytes per segment; a smaller segment costs a message's "
                         f"latency for a few bytes: 1-byte segments made a 1 MiB ring all_reduce take 37 s). "
                         f"RINGCOLL_SEGMENT_FLOOR lowers the floor, for tests of the pipelines on small data")
    return value


def parse_seconds(name: str, text: str) -> Optional[float]:
    """A positive, finite number of seconds (empty: None)."""
    return _number(name, text, float, lambda value: math.isfinite(value) and value > 0,
                   "a positive number of seconds, such as 60 or 2.5")


def parse_choice(name: str, text: str, choices: Tuple[str, ...], default: str) -> str:
    """One of ``choices`` (any case; empty: ``default``)."""
    word = text.strip().lower() or default
    if word not in choices:
        raise _error(name, text, f"one of {_words(choices)} (default {default})")
    return word


def parse_debug(name: str, text: str) -> Optional[int]:
    """A logging level name, or a boolean word: on means INFO (the level that logs each
    call's choice), off or empty means no log."""
    word = text.strip().upper()
    if not word or word.lower() in _FALSE:
        return None
    if word.lower() in _TRUE:
        return logging.INFO
    if word in _LEVELS:
        return _LEVELS[word]
    raise _error(name, text, f"a level, {_words(_LEVELS)} (any case), or a boolean word: "
                             f"{_words(_TRUE)} mean INFO, {_words(_FALSE)} no log")


def parse_ranks(name: str, text: str) -> Optional[FrozenSet[int]]:
    """Global ranks, comma-separated, each a number or a range ``a-b`` (inclusive); empty,
    ``all`` or ``*``: every rank (None)."""
    word = text.strip().lower()
    if word in ("", "all", "*"):
        return None
    accepted = "global ranks, comma-separated, each a number >= 0 or a range a-b (0,2 or 0-3,6), or all"
    ranks = set()
    for part in word.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise _error(name, text, accepted) from None
        if low < 0 or high < low:
            raise _error(name, text, accepted)
        ranks.update(range(low, high + 1))
    return frozenset(ranks)


def parse_algo(name: str, text: str) -> Tuple[Tuple[Optional[str], str], ...]:
    """``RINGCOLL_ALGO``: ``ring`` (every collective that has it) or ``coll=name`` entries,
    comma-separated, as (collective or None, algorithm) pairs in order; the first entry that
    applies to a collective wins. Only the form is checked here: the names are checked against
    the registry where a call or a group first reads the settings
    (:func:`ringcoll.selection.checked_settings`), so settings sit below the algorithms."""
    entries = []
    for entry in text.strip().split(","):
        entry = entry.strip()
        if not entry:
            continue
        if "=" in entry:
            coll, algorithm = (part.strip() for part in entry.split("=", 1))
            if not coll or not algorithm:
                raise ValueError(f"{name}={text.strip()!r} has the entry {entry!r}; each entry is an "
                                 f"algorithm or collective=algorithm, comma-separated")
            entries.append((coll, algorithm))
        else:
            entries.append((None, entry))
    return tuple(entries)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from nccl-tests' size syntax (the command lines: ringcoll-bench, ringcoll-study,
    ``python -m ringcoll.msccl``): ``8``, ``1K``, ``64M``, ``1G`` (powers of 1024;
    ``KB``/``KiB`` accepted too)."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"size must be a number of bytes with an optional K/M/G/T suffix, got {text!r}")
    value, unit = float(match.group(1)), match.group(2).upper()
    nbytes = value * 1024 ** " KMGT".index(unit or " ")
    if nbytes != int(nbytes):
        raise ValueError(f"size must be a whole number of bytes, got {text!r}")
    return int(nbytes)


def parse_group_rank(name: str, text: str) -> str:
    """torchrun's node rank, kept as text (ranks compare it as a node key): "" when unset."""
    word = text.strip()
    if word and not word.isdigit():
        raise _error(name, text, "an integer >= 0 (torchrun sets it to the node's rank)")
    return word


def parse_machine(name: str, text: str) -> Optional[str]:
    """The path of a ``ringcoll.Machine`` JSON (``Machine.save`` writes one), read now: a
    missing or malformed file is refused here rather than at the first call ``auto`` weighs."""
    from .cost.machine import Machine

    path = text.strip()
    if not path:
        return None
    try:
        Machine.load(path)
    except OSError as error:
        raise ValueError(f"{name} names {path!r}, which cannot be read: {error} ({name} accepts "
                         f"the path of a ringcoll.Machine JSON file)") from None
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{name}={path}: not a ringcoll.Machine JSON "
                         f"(ringcoll.Machine.save writes one): {error}") from None
    return path


def parse_tuning(name: str, text: str) -> Optional[str]:
    """The path of a tuning table (``ringcoll-bench --tune`` writes one); it must be a
    readable file. Its rows are read and checked against the registry where a call or a group
    first reads the settings (:func:`ringcoll.selection.checked_settings`)."""
    path = text.strip()
    if not path:
        return None
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise ValueError(f"{name} names {path!r}, which cannot be read: {error} ({name} accepts "
                         f"the path of a tuning table CSV)") from None
    return path


def parse_directory(name: str, text: str) -> Optional[str]:
    """A directory, made when first needed; a path that exists and is no directory is refused."""
    path = text.strip()
    if not path:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        raise _error(name, text, "the path of a directory (made if missing), not a file")
    return path


#: every variable ringcoll reads, in the README's Settings table order
VARIABLES: Tuple[Variable, ...] = (
    Variable("RINGCOLL_ALGO", "`ring`, or `collective=name` entries, comma-separated "
             "(`all_reduce=rabenseifner,broadcast=binomial`); names checked against the registry",
             "unset (`auto` chooses)", "forces the algorithm of `auto` calls; a name given to the "
             "call or in `ringcoll.Options` still wins"),
    Variable("RINGCOLL_CHECK", "boolean: 1/true/yes/on, 0/false/no/off", "off",
             "check mode: every call compares its fingerprint and sequence number across ranks "
             "first; `TORCH_DISTRIBUTED_DEBUG=DETAIL` switches it on too"),
    Variable("RINGCOLL_CUDA_TRANSPORT", "`nccl`, `gloo`", "`nccl` (gloo when NCCL is absent)",
             "the inner group of a `\"ringcoll\"` backend group for CUDA tensors"),
    Variable("RINGCOLL_DEBUG", "`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL` (any case), or a "
             "boolean (on = `INFO`, off = no log)", "no log",
             "logs each call's algorithm and what chose it to stderr, each line prefixed with "
             "the rank"),
    Variable("RINGCOLL_DEBUG_RANKS", "global ranks, comma-separated, numbers or ranges (`0,2`, "
             "`0-3`), or `all`", "every rank", "the ranks whose `RINGCOLL_DEBUG` lines are written"),
    Variable("RINGCOLL_KERNELS", "`auto`, `cupy`, `numba`, `torch`", "`auto`",
             "the local reduction kernels (`ringcoll.kernels.set_backend` wins)"),
    Variable("RINGCOLL_KERNEL_CACHE", "a directory (made when first needed)",
             "`$XDG_CACHE_HOME/ringcoll/kernels` (`~/.cache/...`)", "where NVRTC-compiled kernels are kept"),
    Variable("RINGCOLL_LOCAL_SIZE", "positive integer, the same on every rank of a group", "torchrun's "
             "`GROUP_RANK`, else the hosts' names (agreed by every rank: docs/multi-node.md)",
             "ranks per node (nodes of consecutive global ranks) for the node-aware algorithms and costs"),
    Variable("RINGCOLL_MACHINE", "path of a `ringcoll.Machine` JSON (`Machine.save`, `ringcoll.fit`); "
             "must exist and parse", "the default machine", "the machine `auto`'s cost model weighs "
             "candidates on (`Options(machine=...)` wins)"),
    Variable("RINGCOLL_PERSISTENT_PLANS", "integer >= 0 (0: none)", "16",
             "plans each group keeps for repeated identical small calls"),
    Variable("RINGCOLL_SEGMENT", "integer >= 4096 (bytes; `RINGCOLL_SEGMENT_FLOOR` lowers the "
             "floor), the same on every rank of a group", "the segment table (1 MiB; 16 MiB for "
             "ring all_reduce)", "segment size of the pipelined algorithms; below the floor refused "
             "(a segment costs a message's latency: 1-byte segments made a 1 MiB all_reduce take 37 s)"),
    Variable("RINGCOLL_SEGMENT_FLOOR", "positive integer (bytes)", "4096 (a page; gloo's ring cuts "
             "no chunk below 1 KiB, NCCL none below 16 KiB)", "the smallest `RINGCOLL_SEGMENT` "
             "accepted; lower it only to exercise the pipelines on small data (ringcoll's tests do)"),
    Variable("RINGCOLL_TIMEOUT", "positive number of seconds", "the group's timeout",
             "how long one step may wait for its peers; overrides the group's own timeout "
             "(`ringcoll.set_timeout` and `barrier(timeout=)` win over it)"),
    Variable("RINGCOLL_TRANSPORT", "`auto`, `host`, `batched`, `streamed`", "`auto`",
             "`batched` runs CPU tensors on gloo through the NCCL-shaped batched transport; "
             "`streamed` through the stream-ordered path on emulated streams (docs/gpu.md)"),
    Variable("RINGCOLL_TUNING", "path of a tuning table CSV (`ringcoll-bench --tune`); must exist "
             "and parse", "none", "`auto` takes the first row covering the call"),
    Variable("RINGCOLL_WINDOW", "positive integer", str(EXECUTOR_WINDOW), "steps whose transfers may be in flight at once"),
)
NAMES = tuple(variable.name for variable in VARIABLES)
#: read too: torchrun's node rank (a group's placement when RINGCOLL_LOCAL_SIZE is unset;
#: never LOCAL_WORLD_SIZE, a count of one node's ranks, not of every node's) and torch's debug
#: level (DETAIL switches check mode on)
OTHER_NAMES = ("GROUP_RANK", "TORCH_DISTRIBUTED_DEBUG")
_READ = NAMES + OTHER_NAMES
_FILES = _MACHINE, _TUNING = tuple(_READ.index(name) for name in ("RINGCOLL_MACHINE", "RINGCOLL_TUNING"))


def parse(environ: Mapping[str, str]) -> Settings:
    """The Settings of ``environ`` (any mapping of names to text); ValueError naming the
    first bad variable, its value and what it accepts."""
    def get(name: str) -> str:
        return environ.get(name, "") or ""

    segment_floor = parse_int("RINGCOLL_SEGMENT_FLOOR", get("RINGCOLL_SEGMENT_FLOOR"), 1,
                              "bytes: the smallest RINGCOLL_SEGMENT accepted") or SEGMENT_FLOOR
    return Settings(
        algo=parse_algo("RINGCOLL_ALGO", get("RINGCOLL_ALGO")),
        algo_text=get("RINGCOLL_ALGO").strip(),
        check=(parse_bool("RINGCOLL_CHECK", get("RINGCOLL_CHECK"))
               or get("TORCH_DISTRIBUTED_DEBUG").strip().upper() == "DETAIL"),
        cuda_transport=parse_choice("RINGCOLL_CUDA_TRANSPORT", get("RINGCOLL_CUDA_TRANSPORT"),
                                    ("nccl", "gloo"), "nccl"),
        debug=parse_debug("RINGCOLL_DEBUG", get("RINGCOLL_DEBUG")),
        debug_ranks=parse_ranks("RINGCOLL_DEBUG_RANKS", get("RINGCOLL_DEBUG_RANKS")),
        kernels=parse_choice("RINGCOLL_KERNELS", get("RINGCOLL_KERNELS"), KERNEL_BACKENDS, "auto"),
        kernel_cache=parse_directory("RINGCOLL_KERNEL_CACHE", get("RINGCOLL_KERNEL_CACHE")),
        local_size=parse_int("RINGCOLL_LOCAL_SIZE", get("RINGCOLL_LOCAL_SIZE"), 1, "ranks per node"),
        group_rank=parse_group_rank("GROUP_RANK", get("GROUP_RANK")),
        machine=parse_machine("RINGCOLL_MACHINE", get("RINGCOLL_MACHINE")),
        persistent_plans=parse_int("RINGCOLL_PERSISTENT_PLANS", get("RINGCOLL_PERSISTENT_PLANS"), 0,
                                   "plans kept per group; 0: none"),
        segment=parse_segment("RINGCOLL_SEGMENT", get("RINGCOLL_SEGMENT"), segment_floor),
        segment_floor=segment_floor,
        timeout=parse_seconds("RINGCOLL_TIMEOUT", get("RINGCOLL_TIMEOUT")),
        transport=parse_choice("RINGCOLL_TRANSPORT", get("RINGCOLL_TRANSPORT"),
                               ("auto", "host", "batched", "streamed"), "auto"),
        tuning=parse_tuning("RINGCOLL_TUNING", get("RINGCOLL_TUNING")),
        window=parse_int("RINGCOLL_WINDOW", get("RINGCOLL_WINDOW"), 1, "steps in flight"),
    )


# -- the accessor --------------------------------------------------------------------------
#: os.environ's own dict (bytes keys and values on POSIX), read directly: sixteen lookups
#: through the Mapping would cost more than the rest of a reused call's checks
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEYS = tuple(os.environ.encodekey(name) for name in _READ) if hasattr(os.environ, "encodekey") else None
_ENV_GET = _ENV_DATA.get if _ENV_DATA is not None and _ENV_KEYS is not None else None
_CACHE_SIZE = 64
_cache: Dict[tuple, Settings] = {}
_applied: Optional[Settings] = None


def _stamps(values: tuple) -> tuple:
    """The modification times of the files RINGCOLL_MACHINE and RINGCOLL_TUNING name (None
    where a file cannot be read: parsing then says so)."""
    stamps = []
    for index in _FILES:
        path = values[index]
        if path and path.strip():
            try:
                stamps.append(os.stat(path.strip()).st_mtime_ns)
            except OSError:
                stamps.append(None)
    return tuple(stamps)


def read_cached(cache: dict, variable: str, path: str, load: Callable[[str], Any]) -> Any:
    """``load(path)`` for the file the setting ``variable`` names, kept in ``cache`` (path ->
    (mtime, value)) until the file changes. A file that cannot be read is a ValueError naming
    ``variable`` and the path; ``load``'s own errors pass through."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as error:
        raise ValueError(f"{variable} names {path!r}, which cannot be read: {error}") from None
    cached = cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        value = load(path)
    except OSError as error:
        raise ValueError(f"{variable} names {path!r}, which cannot be read: {error}") from None
    cache[path] = (stamp, value)
    return value


def settings() -> Settings:
    """The Settings of the environment now (see the module docstring); ValueError naming the
    variable, its value and what it accepts when one is bad. Cheap on a repeated call (about
    a microsecond): the raw values of every variable read (from os.environ's own dict), the
    modification times of the files RINGCOLL_MACHINE and RINGCOLL_TUNING name find the
    Settings parsed for exactly those, without parsing."""
    if _ENV_GET is not None:
        values = tuple(map(_ENV_GET, _ENV_KEYS))
    else:
        values = tuple(map(os.environ.get, _READ))
    if values[_MACHINE] is None and values[_TUNING] is None:
        raw = values
    else:
        raw = (values, _stamps(values))
    found = _cache.get(raw)
    if found is None:
        found = parse(os.environ)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[raw] = found
    if found is not _applied:
        _apply(found)
    return found


def check() -> Settings:
    """Validate every setting now (the backend's ``create`` calls it): :func:`settings`."""
    return settings()


# -- RINGCOLL_DEBUG: the log -------------------------------------------------------------
class _RankFilter(logging.Filter):
    """Writes a record only on the ranks RINGCOLL_DEBUG_RANKS names, and puts the rank in it
    (``%(ringcoll_rank)s``): with every rank writing to one terminal, a line must say whose
    it is. The rank is the global rank of the default group, else the launcher's RANK."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = _global_rank()
        record.ringcoll_rank = "?" if rank is None else rank
        ranks = _applied.debug_ranks if _applied is not None else None
        return ranks is None or (rank is not None and rank in ranks)


def _global_rank() -> Optional[int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except (ImportError, RuntimeError, ValueError):
        pass
    text = os.environ.get("RANK", "").strip()
    return int(text) if text.isdigit() else None


_handler: Optional[logging.Handler] = None


def _apply(current: Settings) -> None:
    """Make the ringcoll logger follow RINGCOLL_DEBUG: a stderr handler with the rank filter
    at that level; when the variable goes away again, that handler and level are removed (a
    logger the program configured itself is left alone while RINGCOLL_DEBUG is unset)."""
    global _applied, _handler
    _applied = current
    if current.debug is not None:
        if _handler is None:
            _handler = logging.StreamHandler()
            _handler.setFormatter(logging.Formatter("ringcoll [rank %(ringcoll_rank)s] %(levelname)s: %(message)s"))
            _handler.addFilter(_RankFilter())
            log.addHandler(_handler)
        log.setLevel(current.debug)
    elif _handler is not None:
        log.removeHandler(_handler)
        log.setLevel(logging.NOTSET)
        _handler = None


def configure_logging() -> None:
    """Apply RINGCOLL_DEBUG now (``import ringcoll`` calls it). A bad setting is not raised
    here: importing must never fail on one; the group or the first call refuses it."""
    try:
        settings()
    except ValueError:
        pass


def table() -> str:
    """The README's Settings table (Markdown), from :data:`VARIABLES`."""
    lines = ["| Variable | Accepts | Default | Meaning |", "|---|---|---|---|"]
    lines += [f"| `{v.name}` | {v.accepts} | {v.default} | {v.meaning} |" for v in VARIABLES]
    return "\n".join(lines)


@contextlib.contextmanager
def environment(values: Mapping[str, Any]):
    """``os.environ`` with ``values`` (a name -> its text, or None: unset) while active, each
    variable restored afterwards. Not locked: a caller whose threads may overlap locks around it."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
