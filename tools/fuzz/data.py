"""A trial's data: each rank's inputs (small integers, exact in every dtype), outputs placed
between canaries, the exact local reference, and the count of wrong elements."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from .trials import AVG_RTOL, COMPLEX, INTS, PAD, Trial

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
