"""The simulator's result check: every rank's result against the collective's definition.

The expected results are computed from the inputs alone (copies taken before the run), with
torch's own element-wise operators, never from a schedule: a wrong schedule cannot pass.
Integer and bool results must be exact; floating-point ones agree within a tolerance that
grows with the number of terms reduced (the schedules reduce in other orders).
"""
from __future__ import annotations

import functools
from typing import List, Sequence, Tuple

import torch

from ..ops import ReduceOp, resolve


class ResultError(AssertionError):
    """A simulated collective whose result differs from the collective's definition."""


_FOLD = {
    "sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
    "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor,
}


def _reduce(tensors: Sequence[torch.Tensor], op) -> torch.Tensor:
    spec = resolve(op, tensors[0])
    if spec.local not in _FOLD:
        raise ValueError(f"no reference for the local operator {spec.local!r}")
    terms = [t * spec.premul if spec.premul is not None else t for t in tensors]
    if terms[0].dtype == torch.bool and spec.local in ("sum", "product"):
        total = functools.reduce(torch.logical_or if spec.local == "sum" else torch.logical_and, terms)
    else:
        total = functools.reduce(_FOLD[spec.local], terms)
    if spec.average:
        total = total / len(tensors) if total.is_floating_point() else total // len(tensors)
    return total


def _compare(what: str, got: torch.Tensor, want: torch.Tensor, terms: int) -> None:
    got, want = got.reshape(-1), want.reshape(-1).to(got.dtype)
    if got.numel() != want.numel():
        raise ResultError(f"{what} has {got.numel()} elements, the definition {want.numel()}")
    if got.is_floating_point():
        eps = torch.finfo(got.dtype).eps
        scale = want.abs().max().item() if want.numel() else 0.0
        tol = 8 * eps * max(terms, 1) * max(scale, 1.0)
        bad = ~torch.isclose(got.double(), want.double(), rtol=0, atol=tol) & ~(got.isnan() & want.isnan())
    else:
        bad = got != want
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ResultError(f"{what}: element {i} is {got[i].item()}, the definition gives "
                          f"{want[i].item()} ({int(bad.sum())} of {got.numel()} elements differ)")


def _root(kwargs, name: str, group_name: str, default=None) -> int:
    value = kwargs.get(group_name, kwargs.get(name, default))
    return int(value)


def _op(kwargs, args, position: int):
    if "op" in kwargs:
        return kwargs["op"]
    return args[position] if len(args) > position else ReduceOp.SUM


def check_results(collective: str, before: List[Tuple[tuple, dict]], after: List[tuple]) -> None:
    """Raise :class:`ResultError` naming the rank and first wrong element unless each rank's
    arguments after the run (``after[r]``) hold what ``collective`` defines for the inputs
    ``before[r] = (args, kwargs)``. Supports every ringcoll collective."""
    world = len(before)
    args0, kw0 = before[0]
    name = f"{collective}/{kw0.get('algorithm', 'auto')} world {world}"

    def fail_at(rank: int, part: str = "") -> str:
        return f"{name}: rank {rank}{' ' + part if part else ''}"

    if collective == "all_reduce":
        want = _reduce([a[0] for a, _ in before], _op(kw0, args0, 1))
        for rank in range(world):
            _compare(fail_at(rank), after[rank][0], want, world)
    elif collective == "broadcast":
        root = _root(kw0, "src", "group_src")
        for rank in range(world):
            _compare(fail_at(rank), after[rank][0], before[root][0][0], 1)
    elif collective == "reduce":
        root = _root(kw0, "dst", "group_dst", args0[1] if len(args0) > 1 else None)
        want = _reduce([a[0] for a, _ in before], _op(kw0, args0, 2))
        _compare(fail_at(root), after[root][0], want, world)
    elif collective in ("all_gather_into_tensor", "all_gather_single", "all_gather"):
        want = torch.cat([a[1].reshape(-1) for a, _ in before])
        for rank in range(world):
            out = after[rank][0]
            got = out.reshape(-1) if isinstance(out, torch.Tensor) else torch.cat([t.reshape(-1) for t in out])
            _compare(fail_at(rank), got, want, 1)
    elif collective in ("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter"):
        def blocks(arg):
            if isinstance(arg, torch.Tensor):
                return list(arg.reshape(-1).chunk(world)) if arg.numel() else [arg.reshape(-1)] * world
            return [t.reshape(-1) for t in arg]
        inputs = [blocks(a[1]) for a, _ in before]
        op = _op(kw0, args0, 2)
        for rank in range(world):
            want = _reduce([inputs[r][rank] for r in range(world)], op)
            _compare(fail_at(rank), after[rank][0], want, world)
    elif collective == "all_to_all_single":
        for rank in range(world):
            pieces = []
            for src in range(world):
                s_args, s_kw = before[src]
                src_in = s_args[1]
                in_splits = s_kw.get("input_split_sizes", s_args[3] if len(s_args) > 3 else None)
                splits = in_splits if in_splits is not None else [src_in.shape[0] // world] * world
                offset = sum(splits[:rank])
                pieces.append(src_in[offset:offset + splits[rank]].reshape(-1))
            _compare(fail_at(rank), after[rank][0], torch.cat(pieces), 1)
    elif collective == "all_to_all":
        for rank in range(world):
            for src in range(world):
                _compare(fail_at(rank, f"output_tensor_list[{src}]"), after[rank][0][src],
                         before[src][0][1][rank], 1)
    elif collective == "gather":
        root = _root(kw0, "dst", "group_dst", args0[2] if len(args0) > 2 else 0)
        for src in range(world):
            _compare(fail_at(root, f"gather_list[{src}]"), after[root][1][src], before[src][0][0], 1)
    elif collective == "scatter":
        root = _root(kw0, "src", "group_src", args0[2] if len(args0) > 2 else 0)
        for rank in range(world):
            _compare(fail_at(rank), after[rank][0], before[root][0][1][rank], 1)
    elif collective == "barrier":
        return
    else:
        raise ValueError(f"no definition to check {collective!r} against")
