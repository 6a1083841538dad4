"""The sparse all-reduce of the "ringcoll" backend (gloo's semantics: SUM of sparse COO tensors,
bitwise identical on every rank), built on ringcoll's all_gather."""
from __future__ import annotations

import torch

from typing import List

from ..api.common import BUILDERS, Context
from ..api._checks import as_real
from ..ops import RedOpType
from ..runtime.work import Work, submit


def sparse_all_reduce(tensors, op, contexts: List[Context], algorithm: str) -> Work:
    """SUM of sparse COO tensors, as gloo's: every rank all-gathers every rank's indices
    and values (padded to the largest nnz) with ringcoll's all_gather (``algorithm``), then adds
    the parts in rank order, so the result is bitwise identical everywhere; written into the
    caller's tensor. ``contexts``: one per inner all_gather (the counts, the indices, the
    values), each with its number, taken at the call's entry (docs/semantics.md#a-calls-number)."""
    if len(tensors) != 1 or tensors[0].layout != torch.sparse_coo:
        raise ValueError(f"tensors must be one sparse COO tensor, got {len(tensors)} tensors of layouts "
                         f"{[str(t.layout) for t in tensors]}")
    if op != RedOpType.SUM:
        raise ValueError(f"op must be ReduceOp.SUM for a sparse tensor (as gloo), got {op}")
    tensor, world = tensors[0], contexts[0].world
    counts_ctx, indices_ctx, values_ctx = contexts

    def gathered(local: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Every rank's ``local`` (equal shapes), stacked in rank order (read on the host next)."""
        wire = as_real(local).contiguous()
        out = torch.empty((world,) + wire.shape, dtype=wire.dtype, device=wire.device)
        ctx.agree("all_gather_into_tensor")       # a group's first call: its placement, agreed here
        ctx.executor.execute(BUILDERS["all_gather_into_tensor"](ctx, out, wire, algorithm=algorithm), blocking=True)
        return torch.view_as_complex(out) if local.is_complex() else out

    def task():
        with torch.no_grad():
            mine = tensor.coalesce()
            counts = gathered(torch.tensor([mine._nnz()], device=tensor.device), counts_ctx).view(-1).tolist()
            most = max(counts)
            indices = mine.indices().new_zeros((mine.sparse_dim(), most))
            indices[:, :mine._nnz()] = mine.indices()
            values = mine.values().new_zeros((most,) + tuple(mine.values().shape[1:]))
            values[:mine._nnz()] = mine.values()
            all_indices, all_values = gathered(indices, indices_ctx), gathered(values, values_ctx)
            total = None
            for r, count in enumerate(counts):
                part = torch.sparse_coo_tensor(all_indices[r][:, :count], all_values[r][:count], tensor.shape)
                total = part if total is None else total + part
            tensor.copy_(total.coalesce())

    return submit(task, True, [tensor])
