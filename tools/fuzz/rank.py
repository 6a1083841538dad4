"""One trial on one rank: the call on ringcoll and on the built-in, on the same group, and
what differs (a batch of trials per ``Cluster.run``)."""
from __future__ import annotations

import warnings
from typing import Dict, List, Optional

import torch

from .trials import COLLECTIVES, Trial
from .data import Placed, _canary, _digest, builtin_lacks, count_wrong, inputs_of, place, reference

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
    if COLLECTIVES[c][0]:
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
