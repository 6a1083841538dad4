"""The driver: trials in batches on a launched gloo cluster per world size, replaying a failed
batch trial by trial, and the tally."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional


from .trials import Trial
from .rank import _groups, run_batch

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
