"""The simulator mode: trials in one process, every rank in the simulator, against the exact
reference."""
from __future__ import annotations

from dataclasses import asdict
from typing import List

import torch

from .trials import Trial
from .data import _digest, count_wrong, reference
from .rank import REPLICATED, _Call, _op
from .driver import Tally

# -- the simulator mode -------------------------------------------------------------------
def simulate_trial(trial: Trial) -> dict:
    """A trial on the simulator (whole world, synchronous): ringcoll's builders and schedules
    against the exact local reference, with the same canary and input checks."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import Context
    from ringcoll.cost.machine import Machine
    from ringcoll.sim.engine import run_plans

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
