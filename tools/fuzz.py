"""Randomized differential testing: ringcoll against torch.distributed's built-ins.

    python -m tools.fuzz --trials 10000 --seed 1 --out bench/results/fuzz.json
    python -m tools.fuzz --replay 1:4711          # one trial alone, with its details
    python -m tools.fuzz --simulate --trials 500  # in one process, against the exact reference

A trial is one call drawn from its id ``seed:index`` alone (so it replays alone): collective
× algorithm (``auto`` included) × op × dtype × world size × element count (0, 1, below the
world, not divisible, up to ``--max-bytes``) × root (given as a global or a group rank) ×
sub-group × ``async_op`` × contiguous or strided tensors × tensor lists that are separate
tensors or the chunks of one buffer × in place. Every rank of a launched gloo cluster (one
per world size, kept alive, many trials per ``Cluster.run``) runs the call on ringcoll and
the same call on the built-in, on the same group, and counts the elements where they
differ; where gloo has no built-in (int16, PREMUL_SUM, complex gather, all_to_all lists of
uneven sizes) an exact reference computed locally from every rank's input stands in. The
data are small integers, so every reduction is exact in every dtype and order (AVG is
compared within a dtype's rounding). Besides the values, a trial checks that no element
around an output was written (canaries), that ranks outside the group are untouched, and
that replicated results are bitwise identical on every rank.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

#: collective -> (registry name, rooted, reducing)
COLLECTIVES = {
    "all_reduce": ("all_reduce", False, True),
    "reduce": ("reduce", True, True),
    "broadcast": ("broadcast", True, False),
    "all_gather": ("all_gather", False, False),
    "all_gather_single": ("all_gather", False, False),
    "reduce_scatter": ("reduce_scatter", False, True),
    "reduce_scatter_single": ("reduce_scatter", False, True),
    "gather": ("gather", True, False),
    "scatter": ("scatter", True, False),
    "all_to_all": ("all_to_all", False, False),
    "all_to_all_single": ("all_to_all", False, False),
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
COMPLEX = ("complex64", "complex128")
DTYPES = FLOATS + INTS + ("bool",) + COMPLEX
#: PREMUL_SUM factors that keep sums of small integers exact in every float dtype
FACTORS = (0.25, 0.75, 2.0, 3.0)
#: AVG's tolerance: the built-in may round its one division differently
AVG_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-13,
            "complex64": 1e-6, "complex128": 1e-13}
PAD = 3                     # canary elements before and after every output


def ops_for(dtype: str) -> Tuple[str, ...]:
    if dtype in COMPLEX:
        return ("SUM", "AVG", "PREMUL_SUM")
    if dtype in FLOATS:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


@dataclass
class Trial:
    id: str
    collective: str
    algorithm: str
    dtype: str
    world: int
    numel: int                      # per-rank block (the whole vector for all_reduce, reduce, broadcast)
    op: Optional[str] = None
    factor: Optional[float] = None
    root: int = 0                   # group rank
    root_as: str = "global"         # how ringcoll is given the root: "global" or "group"
    members: Optional[List[int]] = None   # the sub-group's global ranks (None: the whole world)
    async_op: bool = False
    contiguous: bool = True
    chunks: bool = False            # tensor lists as the chunks of one buffer
    in_place: bool = False
    counts: Optional[List[List[int]]] = None   # all_to_all: counts[g][h] elements g sends h

    @property
    def group_size(self) -> int:
        return len(self.members) if self.members else self.world


def parse_worlds(text: str) -> List[int]:
    if "-" in text:
        low, high = (int(part) for part in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(part) for part in text.split(",")]


def sub_groups(world: int) -> List[List[int]]:
    """The few sub-groups a world draws from (each costs a new gloo group on every rank)."""
    if world < 3:
        return []
    return [list(range(1, world)), list(range(0, world, 2)), [0, world - 1]]


def draw(seed: int, index: int, worlds: List[int], max_bytes: int) -> Trial:
    """The trial ``seed:index``, a function of its id alone."""
    trial_id = f"{seed}:{index}"
    rng = random.Random(f"ringcoll-fuzz:{trial_id}")
    import ringcoll

    collective = rng.choice(sorted(COLLECTIVES))
    family, rooted, reducing = COLLECTIVES[collective]
    world = rng.choice(worlds)
    members = None
    if rng.random() < 0.2 and sub_groups(world):
        members = rng.choice(sub_groups(world))
    size = len(members) if members else world
    dtype = rng.choice(DTYPES)
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # the element count: the edges often, a size up to max_bytes (of the whole call) sometimes
    total_blocks = size if collective in ("all_gather", "all_gather_single", "reduce_scatter",
                                          "reduce_scatter_single", "gather", "scatter") else 1
    kind = rng.random()
    if kind < 0.1:
        numel = 0
    elif kind < 0.2:
        numel = 1
    elif kind < 0.3:
        numel = max(size - 1, 1)
    elif kind < 0.4:
        numel = size + 1
    elif kind < 0.8:
        numel = rng.randint(2, 300)
    elif kind < 0.97:
        numel = rng.randint(300, 20000)
    else:
        numel = rng.randint(1, max(1, max_bytes // (itemsize * total_blocks)))
    numel = min(numel, max(1, max_bytes // (itemsize * total_blocks)))
    trial = Trial(trial_id, collective, "auto", dtype, world, numel, members=members)
    names = ringcoll.algorithms(family)
    trial.algorithm = rng.choice(names + ["auto"])
    if reducing:
        trial.op = rng.choice(ops_for(dtype))
        if trial.op == "PREMUL_SUM":
            trial.factor = rng.choice(FACTORS)
    if rooted:
        trial.root = rng.randrange(size)
        trial.root_as = rng.choice(("global", "group"))
    trial.async_op = rng.random() < 0.3
    trial.contiguous = rng.random() < 0.7
    trial.chunks = rng.random() < 0.4
    if collective in ("all_gather_single", "reduce_scatter_single"):
        trial.in_place = rng.random() < 0.3
    if collective.startswith("all_to_all"):
        if rng.random() < 0.5:       # equal blocks
            trial.counts = [[numel] * size for _ in range(size)]
        else:
            high = max(1, min(numel, 2000))
            trial.counts = [[rng.randint(0, high) for _ in range(size)] for _ in range(size)]
        equal = len({c for row in trial.counts for c in row}) == 1
        if trial.algorithm == "bruck" and not equal:      # bruck forwards blocks: equal ones only
            trial.algorithm = "pairwise"
    return trial


# -- data -------------------------------------------------------------------------------
def values(trial: Trial, rank: int, salt: int, numel: int) -> torch.Tensor:
    """Never-zero small integers of the trial's dtype (exact under every op and order)."""
    digest = hashlib.sha256(f"{trial.id}/{rank}/{salt}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    dtype = getattr(torch, trial.dtype)
    if trial.dtype == "bool":
        return torch.rand(numel, generator=gen) < 0.6
    if trial.dtype in INTS:
        high = 127 if trial.op in ("BAND", "BOR", "BXOR") else 4
        return torch.randint(1, high, (numel,), generator=gen).to(dtype)
    if trial.op == "PRODUCT":
        magnitude = torch.randint(1, 3, (numel,), generator=gen)
    else:
        magnitude = torch.randint(1, 4, (numel,), generator=gen)
    sign = 1 - 2 * torch.randint(0, 2, (numel,), generator=gen)
    real = (magnitude * sign).to(torch.float64)
    if trial.dtype in COMPLEX:
        imag = torch.randint(1, 4, (numel,), generator=gen).to(torch.float64)
        return torch.complex(real, -imag).to(dtype)
    return real.to(dtype)


def _canary(dtype: torch.dtype):
    return True if dtype == torch.bool else 77


@dataclass
class Placed:
    """A tensor the call writes, inside a larger buffer whose other elements are canaries."""

    base: torch.Tensor
    tensor: torch.Tensor
    mask: torch.Tensor = field(repr=False)      # True where the base holds canaries

    def canaries_ok(self) -> bool:
        return bool((self.base[self.mask] == _canary(self.base.dtype)).all())


def place(data: List[torch.Tensor], contiguous: bool, chunks: bool) -> List[Placed]:
    """``data`` copied into fresh tensors surrounded by canaries: each in its own buffer, or
    all as the chunks of one buffer; strided (every other element) unless ``contiguous``."""
    if not data:
        return []
    dtype = data[0].dtype
    step = 1 if contiguous else 2
    groups = [data] if chunks else [[d] for d in data]
    placed = []
    for group in groups:
        total = sum(d.numel() for d in group)
        base = torch.full((2 * PAD + step * total,), _canary(dtype), dtype=dtype)
        mask = torch.ones(base.numel(), dtype=torch.bool)
        offset = PAD
        for d in group:
            view = base[offset:offset + step * d.numel():step]
            view.copy_(d)
            mask[offset:offset + step * d.numel():step] = False
            placed.append(Placed(base, view, mask))
            offset += step * d.numel()
    return placed


# -- the exact local reference ----------------------------------------------------------
def reduce_all(tensors: List[torch.Tensor], trial: Trial) -> torch.Tensor:
    op, world = trial.op, len(tensors)
    if op == "PREMUL_SUM":
        tensors = [t * trial.factor for t in tensors]
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in ("SUM", "AVG", "PREMUL_SUM"):
            acc = (acc | t) if acc.dtype == torch.bool else acc + t
        elif op == "PRODUCT":
            acc = (acc & t) if acc.dtype == torch.bool else acc * t
        elif op == "MIN":
            acc = torch.minimum(acc, t)
        elif op == "MAX":
            acc = torch.maximum(acc, t)
        elif op == "BAND":
            acc = acc & t
        elif op == "BOR":
            acc = acc | t
        elif op == "BXOR":
            acc = acc ^ t
    if op == "AVG":
        acc = acc / world
    return acc


def inputs_of(trial: Trial, g: int) -> dict:
    """Group rank ``g``'s input data (contiguous, fresh), by collective."""
    p, n, c = trial.group_size, trial.numel, trial.collective
    if c in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_single", "gather"):
        return {"x": values(trial, g, 0, n)}
    if c in ("reduce_scatter", "reduce_scatter_single"):
        return {"blocks": [values(trial, g, h + 1, n) for h in range(p)]}
    if c == "scatter":
        return {"blocks": [values(trial, g, h + 1, n) for h in range(p)] if g == trial.root else None}
    return {"blocks": [values(trial, g, h + 1, trial.counts[g][h]) for h in range(p)]}


def reference(trial: Trial, g: int) -> Optional[List[torch.Tensor]]:
    """What group rank ``g`` must hold after the call (None: nothing defined)."""
    p, c, root = trial.group_size, trial.collective, trial.root
    every = [inputs_of(trial, h) for h in range(p)]
    if c == "all_reduce":
        return [reduce_all([e["x"] for e in every], trial)]
    if c == "reduce":
        return [reduce_all([e["x"] for e in every], trial)] if g == root else None
    if c == "broadcast":
        return [every[root]["x"]]
    if c in ("all_gather", "all_gather_single"):
        return [e["x"] for e in every]
    if c == "gather":
        return [e["x"] for e in every] if g == root else None
    if c in ("reduce_scatter", "reduce_scatter_single"):
        return [reduce_all([e["blocks"][g] for e in every], trial)]
    if c == "scatter":
        return [every[root]["blocks"][g]]
    return [every[h]["blocks"][g] for h in range(p)]


def builtin_lacks(trial: Trial) -> bool:
    """Cases torch's gloo built-ins refuse (or get wrong): the local reference stands in."""
    if trial.dtype == "int16" or trial.op == "PREMUL_SUM":
        return True
    if trial.collective == "gather" and trial.dtype in COMPLEX:
        return True
    if trial.collective == "all_to_all":
        return len({x for row in trial.counts for x in row}) != 1
    return False


# -- one trial on one rank --------------------------------------------------------------
def _op(trial: Trial):
    import torch.distributed as dist

    if trial.op is None:
        return None
    if trial.op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(trial.factor)
    return getattr(dist.ReduceOp, trial.op)


class _Call:
    """One rank's arguments of a call: the tensors it passes and those it must find written."""

    def __init__(self, trial: Trial, g: Optional[int]):
        self.trial = trial
        p, n, c = trial.group_size, trial.numel, trial.collective
        cont, chunks = trial.contiguous, trial.chunks
        rank = g if g is not None else 0
        self._g = rank
        data = inputs_of(trial, rank)
        dtype = getattr(torch, trial.dtype)
        self.written: List[Placed] = []       # outputs, in the reference's order
        self.kept: List[Placed] = []          # inputs that must not change
        if c in ("all_reduce", "reduce", "broadcast"):
            (x,) = place([data["x"]], cont, False)
            self.args = [x.tensor]
            self.written = [x]
        elif c == "all_gather":
            (x,) = place([data["x"]], cont, False)
            outs = place([torch.zeros(n, dtype=dtype) + _canary(dtype)] * p, cont, chunks)
            self.args = [[o.tensor for o in outs], x.tensor]
            self.written, self.kept = outs, [x]
        elif c == "all_gather_single":
            (out,) = place([torch.zeros(p * n, dtype=dtype) + _canary(dtype)], cont, False)
            if trial.in_place:
                block = out.tensor[rank * n:(rank + 1) * n]
                block.copy_(data["x"])
                self.args = [out.tensor, block]
            else:
                (x,) = place([data["x"]], cont, False)
                self.args = [out.tensor, x.tensor]
                self.kept = [x]
            self.written = [out]
        elif c == "gather":
            (x,) = place([data["x"]], cont, False)
            outs = place([torch.zeros(n, dtype=dtype) + _canary(dtype)] * p, cont, chunks) \
                if rank == trial.root and g is not None else []
            self.args = [x.tensor, [o.tensor for o in outs] or None]
            self.written, self.kept = outs, [x]
        elif c == "scatter":
            (out,) = place([torch.zeros(n, dtype=dtype) + _canary(dtype)], cont, False)
            blocks = place(data["blocks"], cont, chunks) if data["blocks"] is not None and g is not None else []
            self.args = [out.tensor, [b.tensor for b in blocks] or None]
            self.written, self.kept = [out], blocks
        elif c == "reduce_scatter":
            (out,) = place([torch.zeros(n, dtype=dtype) + _canary(dtype)], cont, False)
            blocks = place(data["blocks"], cont, chunks)
            self.args = [out.tensor, [b.tensor for b in blocks]]
            self.written, self.kept = [out], blocks
        elif c == "reduce_scatter_single":
            (big,) = place([torch.cat(data["blocks"])], cont, False)
            if trial.in_place:
                self.args = [big.tensor[rank * n:(rank + 1) * n], big.tensor]
                self.written = [Placed(big.base, self.args[0], big.mask)]
            else:
                (out,) = place([torch.zeros(n, dtype=dtype) + _canary(dtype)], cont, False)
                self.args = [out.tensor, big.tensor]
                self.written, self.kept = [out], [big]
        elif c == "all_to_all":
            recv = [trial.counts[h][rank] for h in range(p)]
            blocks = place(data["blocks"], cont, chunks)
            outs = place([torch.zeros(k, dtype=dtype) + _canary(dtype) for k in recv], cont, chunks)
            self.args = [[o.tensor for o in outs], [b.tensor for b in blocks]]
            self.written, self.kept = outs, blocks
        else:       # all_to_all_single
            recv = [trial.counts[h][rank] for h in range(p)]
            (big,) = place([torch.cat(data["blocks"])], cont, False)
            (out,) = place([torch.zeros(sum(recv), dtype=dtype) + _canary(dtype)], cont, False)
            equal = len({x for row in trial.counts for x in row}) == 1
            self.args = [out.tensor, big.tensor, None if equal else recv,
                         None if equal else list(trial.counts[rank])]
            self.written, self.kept = [out], [big]
        self.kept_before = [k.tensor.clone() for k in self.kept]

    def outputs(self) -> List[torch.Tensor]:
        """The call's results in the reference's order."""
        c = self.trial.collective
        if c in ("all_gather_single", "all_to_all_single") or (
                c == "reduce_scatter_single"):
            out = self.written[0].tensor
            if c == "all_gather_single":
                return list(out.view(self.trial.group_size, -1).unbind(0)) if out.numel() else \
                    [out[:0]] * self.trial.group_size
            if c == "all_to_all_single":
                g = self._g
                recv = [self.trial.counts[h][g] for h in range(self.trial.group_size)]
                return list(out.split(recv))
            return [out]
        return [w.tensor for w in self.written]


def _run(module, trial: Trial, call: _Call, group, builtin: bool):
    """Make ``call`` on ``module`` (ringcoll or torch.distributed)."""
    c, op = trial.collective, _op(trial)
    args = call.args
    kwargs = {"group": group, "async_op": trial.async_op}
    if not builtin:
        kwargs["algorithm"] = trial.algorithm
    root_kwargs = {}
    if COLLECTIVES[c][1]:
        name = "dst" if c in ("reduce", "gather") else "src"
        if builtin or trial.root_as == "group":
            root_kwargs = {f"group_{name}": trial.root}
        else:
            root_kwargs = {name: (trial.members or list(range(trial.world)))[trial.root]}
    fn = getattr(module, c)
    if c in ("all_reduce",):
        work = fn(args[0], op=op, **kwargs)
    elif c == "reduce":
        work = fn(args[0], op=op, **root_kwargs, **kwargs)
    elif c == "broadcast":
        work = fn(args[0], **root_kwargs, **kwargs)
    elif c in ("gather", "scatter"):
        work = fn(args[0], args[1], **root_kwargs, **kwargs)
    elif c in ("reduce_scatter", "reduce_scatter_single"):
        work = fn(args[0], args[1], op=op, **kwargs)
    elif c == "all_to_all_single":
        work = fn(args[0], args[1], args[2], args[3], **kwargs)
    else:
        work = fn(args[0], args[1], **kwargs)
    if trial.async_op:
        if work is None:
            if group is None or _member(trial):
                raise RuntimeError("async_op=True returned no Work")
        else:
            work.wait()
    elif work is not None:
        raise RuntimeError(f"async_op=False returned {work!r}")


def _member(trial: Trial) -> bool:
    import torch.distributed as dist

    return trial.members is None or dist.get_rank() in trial.members


def _contiguous_copy(call: _Call) -> _Call:
    """The built-in's twin of a call: the same data in separate contiguous tensors (gloo
    refuses strided ones), so in-place forms become out-of-place ones."""
    twin = _Call.__new__(_Call)
    twin.trial, twin._g = call.trial, call._g

    def copy(value):
        if isinstance(value, torch.Tensor):
            return value.clone(memory_format=torch.contiguous_format)
        if isinstance(value, list):
            return [copy(v) for v in value]
        return value

    twin.args = copy(call.args)
    outs = twin.args[1 if call.trial.collective == "gather" else 0]
    outs = outs if isinstance(outs, list) else ([] if outs is None else [outs])
    twin.written = [Placed(t, t, torch.zeros(t.numel(), dtype=torch.bool)) for t in outs]
    return twin


def count_wrong(got: List[torch.Tensor], want: List[torch.Tensor], trial: Trial) -> Tuple[int, int]:
    """(wrong elements, elements checked)."""
    wrong = checked = 0
    if len(got) != len(want):
        return max(len(got), len(want)), max(len(got), len(want))
    for a, b in zip(got, want):
        if a.numel() != b.numel():
            wrong += max(a.numel(), b.numel())
            checked += max(a.numel(), b.numel())
            continue
        a, b = a.reshape(-1), b.reshape(-1).to(a.dtype)
        checked += a.numel()
        if trial.op == "AVG":
            rtol = AVG_RTOL[trial.dtype]
            a64 = a.to(torch.complex128 if a.is_complex() else torch.float64)
            b64 = b.to(a64.dtype)
            bad = (a64 - b64).abs() > rtol * b64.abs() + 1e-30
        else:
            bad = a != b
        wrong += int(bad.sum())
    return wrong, checked


def _digest(tensors: List[torch.Tensor]) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8).numpy().tobytes()
                 if t.numel() else b"")
    return h.hexdigest()


REPLICATED = ("all_reduce", "broadcast", "all_gather", "all_gather_single")


class TrialsStopped(Exception):
    """A call raised on this rank: the results so far and the error (later trials of the batch
    are not run: the ranks no longer agree on what comes next)."""

    def __init__(self, results: list, error: str):
        super().__init__(results, error)
        self.results, self.error = results, error

    def __str__(self) -> str:
        return f"trial stopped: {self.error}"


_groups: Dict[tuple, object] = {}


def _group(trial: Trial):
    import torch.distributed as dist

    if trial.members is None:
        return None
    key = tuple(trial.members)
    if key not in _groups:
        _groups[key] = dist.new_group(list(key))
    return _groups[key]


def run_trial(trial: Trial, detail: bool = False) -> dict:
    """One trial on this rank (every rank of the cluster runs it): its findings."""
    import torch.distributed as dist

    import ringcoll

    rank = dist.get_rank()
    group = _group(trial)
    member = _member(trial)
    g = (trial.members.index(rank) if trial.members else rank) if member else None
    call = _Call(trial, g)
    result = {"id": trial.id, "wrong": 0, "checked": 0, "canaries": True, "untouched": True,
              "digest": None, "reference": "local" if builtin_lacks(trial) else "built-in"}
    if not member:
        before = [w.base.clone() for w in call.written] + [k.tensor.clone() for k in call.kept]
        _run(ringcoll, trial, call, group, builtin=False)
        after = [w.base for w in call.written] + [k.tensor for k in call.kept]
        result["untouched"] = all(torch.equal(a, b) for a, b in zip(before, after))
        return result
    if builtin_lacks(trial):
        want = reference(trial, g)
    else:
        twin = _contiguous_copy(call)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(dist, trial, twin, group, builtin=True)
        want = twin.outputs() if (trial.collective not in ("reduce", "gather") or g == trial.root) else None
    _run(ringcoll, trial, call, group, builtin=False)
    if want is not None:
        got = call.outputs()
        result["wrong"], result["checked"] = count_wrong(got, want, trial)
        if detail and result["wrong"]:
            result["detail"] = [(a.reshape(-1)[:16].tolist(), b.reshape(-1)[:16].tolist()) for a, b in zip(got, want)]
        if trial.collective in REPLICATED:
            result["digest"] = _digest(got)
    result["canaries"] = all(w.canaries_ok() for w in call.written)
    result["untouched"] = all(torch.equal(k.tensor, b) for k, b in zip(call.kept, call.kept_before))
    return result


def run_batch(trials: List[dict], detail: bool = False) -> list:
    """Every trial of a batch on this rank, in order; a call that raises stops the batch."""
    torch.set_num_threads(1)
    results = []
    for spec in trials:
        trial = Trial(**spec)
        try:
            results.append(run_trial(trial, detail))
        except Exception as error:  # noqa: BLE001 - reported with its trial id
            raise TrialsStopped(results, f"trial {trial.id}: {type(error).__name__}: {error}") from None
    return results


# -- the driver ---------------------------------------------------------------------------
@dataclass
class Tally:
    trials: int = 0
    wrong_elements: int = 0
    checked_elements: int = 0
    failing: List[dict] = field(default_factory=list)
    by_collective: Dict[str, int] = field(default_factory=dict)
    by_reference: Dict[str, int] = field(default_factory=dict)

    def add(self, trial: dict, answers: List[dict], error: Optional[str] = None, problems=()) -> None:
        self.trials += 1
        self.by_collective[trial["collective"]] = self.by_collective.get(trial["collective"], 0) + 1
        problems = list(problems)
        if error is not None:
            problems.append(error)
        else:
            wrong = sum(a["wrong"] for a in answers)
            self.wrong_elements += wrong
            self.checked_elements += sum(a["checked"] for a in answers)
            ref = answers[0]["reference"] if answers else "local"
            self.by_reference[ref] = self.by_reference.get(ref, 0) + 1
            if wrong:
                problems.append(f"{wrong} wrong elements")
            for rank, a in enumerate(answers):
                if not a["canaries"]:
                    problems.append(f"rank {rank} wrote outside its output")
                if not a["untouched"]:
                    problems.append(f"rank {rank} changed an input (or, outside the group, anything)")
            digests = {a["digest"] for a in answers if a["digest"] is not None}
            if len(digests) > 1:
                problems.append("replicated results differ in bits across ranks")
        if problems:
            self.failing.append({"id": trial["id"], "problems": problems, "trial": trial,
                                 **({"detail": [a.get("detail") for a in answers]} if answers else {})})


def _launch(world: int, timeout: float):
    import ringcoll

    return ringcoll.launch(world, "gloo", timeout=timeout, threads=1,
                           env={"RINGCOLL_TIMEOUT": str(min(60.0, timeout / 2))})


def run_trials(trials: List[Trial], *, batch: int = 40, timeout: float = 300.0, detail: bool = False,
               progress=print) -> Tally:
    """Run ``trials`` on launched gloo clusters, one world size at a time."""
    tally = Tally()
    by_world: Dict[int, List[Trial]] = {}
    for trial in trials:
        by_world.setdefault(trial.world, []).append(trial)
    start = time.monotonic()
    for world in sorted(by_world):
        todo = [asdict(t) for t in by_world[world]]
        _groups.clear()
        cluster = _launch(world, timeout)
        try:
            at = 0
            while at < len(todo):
                chunk = todo[at:at + batch]
                try:
                    answers = cluster.run(run_batch, chunk, detail, timeout=timeout)
                except Exception as error:  # noqa: BLE001 - find the trial alone
                    cluster.close()
                    cluster = _replay_alone(chunk, world, timeout, tally, detail, error)
                else:
                    for index, spec in enumerate(chunk):
                        tally.add(spec, [answers[rank][index] for rank in range(world)])
                at += len(chunk)
                elapsed = time.monotonic() - start
                progress(f"world {world}: {tally.trials}/{len(trials)} trials, {tally.wrong_elements} wrong "
                         f"elements, {len(tally.failing)} failing, {tally.trials / max(elapsed, 1e-9):.1f} trials/s")
        finally:
            cluster.close()
    return tally


def _replay_alone(chunk: List[dict], world: int, timeout: float, tally: Tally, detail: bool, first_error):
    """A batch stopped: run its trials one by one (a fresh cluster after each failure) so the
    failing trial is named and the others still count."""
    cluster = _launch(world, timeout)
    for spec in chunk:
        _groups.clear()
        try:
            answers = cluster.run(run_batch, [spec], detail, timeout=timeout)
        except Exception as error:  # noqa: BLE001
            message = getattr(error, "error", None) or f"{type(error).__name__}: {error}"
            tally.add(spec, [], error=str(message)[:2000])
            cluster.close()
            cluster = _launch(world, timeout)
        else:
            tally.add(spec, [answers[rank][0] for rank in range(world)])
    return cluster


# -- the simulator mode -------------------------------------------------------------------
def simulate_trial(trial: Trial) -> dict:
    """A trial on the simulator (whole world, synchronous): ringcoll's builders and schedules
    against the exact local reference, with the same canary and input checks."""
    from ringcoll.api import BUILDERS
    from ringcoll.api._common import Context
    from ringcoll.sim.engine import Machine, run_plans

    trial = Trial(**{**asdict(trial), "world": trial.group_size, "members": None, "async_op": False})
    calls, plans = [], []
    for g in range(trial.world):
        call = _Call(trial, g)
        calls.append(call)
        plans.append(_build(BUILDERS, Context(g, trial.world), trial, call))
    with torch.no_grad():
        run_plans([p for p in plans], Machine())
    result = {"id": trial.id, "wrong": 0, "checked": 0, "canaries": True, "untouched": True, "digest": None,
              "reference": "local"}
    digests = set()
    for g, call in enumerate(calls):
        want = reference(trial, g)
        if want is None:
            continue
        got = call.outputs()
        wrong, checked = count_wrong(got, want, trial)
        result["wrong"] += wrong
        result["checked"] += checked
        result["canaries"] &= all(w.canaries_ok() for w in call.written)
        result["untouched"] &= all(torch.equal(k.tensor, b) for k, b in zip(call.kept, call.kept_before))
        if trial.collective in REPLICATED:
            digests.add(_digest(got))
    result["differ"] = len(digests) > 1
    return result


def _build(builders, ctx, trial: Trial, call: _Call):
    c, op, args = trial.collective, _op(trial), call.args
    kw = {"algorithm": trial.algorithm}
    if c in ("all_reduce",):
        return builders[c](ctx, args[0], op, **kw)
    if c == "reduce":
        return builders[c](ctx, args[0], None, op, group_dst=trial.root, **kw)
    if c == "broadcast":
        return builders[c](ctx, args[0], None, group_src=trial.root, **kw)
    if c in ("gather", "scatter"):
        return builders[c](ctx, args[0], args[1], None, trial.root, **kw)
    if c in ("reduce_scatter", "reduce_scatter_single"):
        return builders[c](ctx, args[0], args[1], op, **kw)
    if c == "all_to_all_single":
        return builders[c](ctx, args[0], args[1], args[2], args[3], **kw)
    return builders[c](ctx, args[0], args[1], **kw)


def simulate_trials(trials: List[Trial], progress=print) -> Tally:
    tally = Tally()
    for index, trial in enumerate(trials):
        spec = asdict(trial)
        try:
            answer = simulate_trial(trial)
        except Exception as error:  # noqa: BLE001
            tally.add(spec, [], error=f"trial {trial.id}: {type(error).__name__}: {error}")
        else:
            differ = answer.pop("differ")
            tally.add(spec, [answer], problems=["replicated results differ in bits across ranks"] if differ else ())
        if progress and (index + 1) % 500 == 0:
            progress(f"simulated {index + 1}/{len(trials)} trials, {tally.wrong_elements} wrong elements")
    return tally


def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worlds", default="1-8", help="world sizes: 1-8 or 2,3,5 (default 1-8)")
    parser.add_argument("--max-bytes", type=int, default=2 << 20, help="largest call, bytes (default 2 MiB)")
    parser.add_argument("--batch", type=int, default=40, help="trials per Cluster.run (default 40)")
    parser.add_argument("--timeout", type=float, default=300.0, help="s per batch (default 300)")
    parser.add_argument("--replay", metavar="SEED:INDEX", help="run this one trial alone, with details")
    parser.add_argument("--simulate", action="store_true", help="in one process, on the simulator")
    parser.add_argument("--out", help="write the summary as JSON here")
    args = parser.parse_args(argv)
    worlds = parse_worlds(args.worlds)
    if args.replay:
        seed, index = (int(part) for part in args.replay.split(":"))
        trials = [draw(seed, index, worlds, args.max_bytes)]
        print(json.dumps(asdict(trials[0])))
    else:
        trials = [draw(args.seed, index, worlds, args.max_bytes) for index in range(args.trials)]
    load_before = _load()
    start = time.monotonic()
    if args.simulate:
        tally = simulate_trials(trials)
    else:
        tally = run_trials(trials, batch=args.batch, timeout=args.timeout, detail=bool(args.replay),
                           progress=lambda line: print(line, flush=True))
    elapsed = time.monotonic() - start
    summary = {
        "command": "python -m tools.fuzz " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": "simulator" if args.simulate else "gloo",
        "seed": args.seed, "worlds": worlds, "max_bytes": args.max_bytes,
        "trials": tally.trials, "wrong_elements": tally.wrong_elements,
        "checked_elements": tally.checked_elements, "failing_trials": len(tally.failing),
        "failing": tally.failing[:50], "by_collective": tally.by_collective,
        "reference": tally.by_reference, "seconds": round(elapsed, 1),
        "load_before": load_before, "load_after": _load(), "cores": os.cpu_count(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"{tally.trials} trials, {tally.wrong_elements} wrong elements of {tally.checked_elements} checked, "
          f"{len(tally.failing)} failing trials, {elapsed:.0f} s")
    for failure in tally.failing[:20]:
        print(f"  FAIL {failure['id']}: {'; '.join(failure['problems'])[:300]}  "
              f"(replay: python -m tools.fuzz --replay {failure['id']} --worlds {args.worlds})")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    return 1 if tally.failing else 0


if __name__ == "__main__":
    sys.exit(main())
