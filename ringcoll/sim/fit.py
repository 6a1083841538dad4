"""Calibration: fit a :class:`ringcoll.Machine` to ``ringcoll-bench`` measurements.

Every measured row (collective, algorithm, world, bytes, time) gives one equation
``time ≈ a·α + b·β + c·γ`` where (a, b, c) is the algorithm's closed-form cost, which equals
the simulator's clock on a flat single-port machine. All rows of all collectives are fitted
together, non-negatively, in relative error (each row divided by its time, so 1 KiB rows
count as much as 64 MiB ones). β and γ are collinear in the reducing collectives' formulas
(all_reduce alone has b = 2c for ring and Rabenseifner): the copy-only collectives (broadcast,
all_gather, gather, scatter, all_to_all) pin β, and when the rows cannot tell β from γ apart
(their columns nearly parallel) γ is tied to β by ``gamma_ratio`` and the report says so.
A fit with no more rows than free parameters, or whose rows cannot tell the parameters
apart (rank below their number), fits its rows exactly by construction: its error bands say
nothing, and the fit warns (``UserWarning``) and its report says so.

The report states the fit's error as it is: the rms and the worst of |predicted / measured − 1|
over the rows fitted (in-sample, each named by :meth:`Fit.rows`), and separately over any
held-out rows (predicted, never fitted: ``fit_samples(samples, held_out=...)``).
"""
from __future__ import annotations

import itertools
import json
import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np

from ..schedules import registry
from ..schedules.registry import Cost
from ..cost.machine import Machine
from ..selection import segment_bytes

_ITEMSIZE = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2,
             "bfloat16": 2, "int32": 4, "int64": 8, "int8": 1, "uint8": 1}
BANDS = ((0, 64 * 1024, "< 64 KiB"), (64 * 1024, 1024 * 1024, "64 KiB - 1 MiB"),
         (1024 * 1024, float("inf"), ">= 1 MiB"))


@dataclass
class Sample:
    collective: str             # the registry's collective
    algorithm: str
    world: int
    nbytes: int
    seconds: float
    coefficients: Tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass
class Fit:
    machine: Machine
    samples: List[Sample]
    tied: bool                              # γ tied to β (collinear)
    bands: Dict[str, Dict[str, float]] = field(default_factory=dict)
    #: what the machine is: "fitted" (to these samples) or where a given machine came from
    label: str = "fitted"
    #: why the error bands may say nothing (an under-determined fit), for the report
    warnings: List[str] = field(default_factory=list)
    #: rows predicted but not fitted (their errors are out of sample)
    held_out: List[Sample] = field(default_factory=list)

    def predict(self, sample: Sample) -> float:
        """The sample's time on the machine (every message at its slowest link)."""
        return Cost(*sample.coefficients).on(self.machine)

    def on(self, machine: Machine, label: str) -> "Fit":
        """These samples' predictions and error bands on another ``machine`` (a given one,
        not fitted to them), labelled ``label``."""
        other = Fit(machine, self.samples, False, label=label, held_out=self.held_out)
        other.bands = error_bands(other)
        return other

    def error(self, sample: Sample) -> float:
        """predicted / measured − 1 of one row."""
        return self.predict(sample) / sample.seconds - 1

    def summary(self, samples: Sequence[Sample]) -> Dict[str, object]:
        """Rows, rms and worst |error| of ``samples``, and the worst row's name."""
        errors = [abs(self.error(s)) for s in samples]
        worst = int(np.argmax(errors)) if errors else None
        return {"rows": len(errors), "rms": float(np.sqrt(np.mean(np.square(errors)))) if errors else None,
                "worst": errors[worst] if errors else None,
                "worst_row": row_name(samples[worst]) if errors else None}

    def rows(self) -> List[Dict[str, object]]:
        """Every row: its name, measured and predicted seconds, error, and whether it was
        fitted (``in_sample``; a given machine's rows were not: False) or held out."""
        fitted = self.label == "fitted"
        return [{"row": row_name(s), "collective": s.collective, "algorithm": s.algorithm, "world": s.world,
                 "nbytes": s.nbytes, "measured_s": s.seconds, "predicted_s": self.predict(s),
                 "error": self.error(s), "in_sample": fitted and not held}
                for held, group in ((False, self.samples), (True, self.held_out)) for s in group]

    def to_dict(self) -> Dict[str, object]:
        """The report as data: the machine (``Machine.from_dict`` reads it), the errors, every row."""
        return {"label": self.label, "machine": self.machine.to_dict(), "tied": self.tied,
                "in_sample" if self.label == "fitted" else "against": self.summary(self.samples),
                "held_out": self.summary(self.held_out), "bands": self.bands, "warnings": list(self.warnings),
                "rows": self.rows()}

    def report(self) -> str:
        m = self.machine
        kind = "fitted" if self.label == "fitted" else f"given machine ({self.label}), not fitted:"
        lines = [f"{kind} α = {m.alpha * 1e6:.3g} µs, β = {1 / m.beta / 1e9 if m.beta else float('inf'):.3g} GB/s, "
                 f"γ = {1 / m.gamma / 1e9 if m.gamma else float('inf'):.3g} GB/s reduced"
                 f"{' (γ tied to β: collinear in these rows)' if self.tied else ''}, "
                 f"{'from' if self.label == 'fitted' else 'against'} {len(self.samples)} rows"]
        if not m.flat:
            lines.append(f"  {m.describe()}")
        for band, row in self.bands.items():
            lines.append(f"  {band:>15}: {row['rows']:4d} rows, median |error| {row['median'] * 100:5.1f} %, "
                         f"90th percentile {row['p90'] * 100:5.1f} %")
        for name, samples in (("in-sample (fitted)" if self.label == "fitted" else "all rows (none fitted)",
                               self.samples), ("held out (not fitted)", self.held_out)):
            if samples:
                row = self.summary(samples)
                lines.append(f"  {name}: {row['rows']} rows, rms |error| {row['rms'] * 100:.1f} %, worst "
                             f"{row['worst'] * 100:.1f} % ({row['worst_row']})")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def row_name(sample: Sample) -> str:
    """One row as the report names it: collective/algorithm p=world n=bytes."""
    return f"{sample.collective}/{sample.algorithm} p={sample.world} n={sample.nbytes}"


def error_bands(result: Fit) -> Dict[str, Dict[str, float]]:
    """Rows, median and 90th percentile of |predicted / measured - 1| per size band."""
    bands = {}
    for lo, hi, name in BANDS:
        errors = [abs(result.predict(s) / s.seconds - 1) for s in result.samples if lo <= s.nbytes < hi]
        if errors:
            bands[name] = {"rows": len(errors), "median": float(np.median(errors)),
                           "p90": float(np.percentile(errors, 90))}
    return bands


def samples_from_bench(paths: Iterable[str]) -> List[Sample]:
    """The rows of ``ringcoll-bench`` JSON files that a registered algorithm ran without error
    (not ``built-in`` nor ``auto``), median times in seconds."""
    out: List[Sample] = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        world = doc["meta"]["world_size"]
        for row in doc.get("rows", []):
            if row.get("error") or row.get("algorithm") in (None, "built-in", "auto"):
                continue
            family = registry.collective_of(row["collective"])
            if family not in registry.algorithms() or row["algorithm"] not in registry.algorithms(family):
                continue
            nbytes = int(row.get("count", 0)) * _ITEMSIZE.get(row.get("type", "float32"), 4)
            out.append(Sample(family, row["algorithm"], world, nbytes, row["time_us"] * 1e-6))
    return out


def coefficients(sample: Sample, itemsize: int = 4) -> Tuple[float, float, float]:
    algorithm = registry.get(sample.collective, sample.algorithm)
    segment = segment_bytes(sample.collective, sample.algorithm)
    segment -= segment % itemsize
    return tuple(registry.model(algorithm, sample.world, sample.nbytes, segment=segment))


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of every subset's solution."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y ** 2))
    for size in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), size):
            x, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.all(x >= 0):
                full = np.zeros(a.shape[1])
                full[list(cols)] = x
                err = float(np.sum((a @ full - y) ** 2))
                if err < best_err - 1e-18:
                    best, best_err = full, err
    return best


def fit_samples(samples: Sequence[Sample], gamma_ratio: float = 0.5, collinear: float = 0.999,
                held_out: Sequence[Sample] = ()) -> Fit:
    """The joint non-negative fit of α, β, γ to ``samples`` (see the module docstring);
    ``held_out`` rows are predicted and reported apart, never fitted."""
    samples = [s for s in samples if s.seconds > 0]
    held_out = [s for s in held_out if s.seconds > 0]
    if not samples:
        raise ValueError("fit needs at least one measured row of a registered algorithm")
    for s in samples + held_out:
        s.coefficients = coefficients(s)
    a = np.array([s.coefficients for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples])
    weighted = a / y[:, None]
    ones = np.ones(len(samples))
    b, c = weighted[:, 1], weighted[:, 2]
    cosine = float(b @ c / (np.linalg.norm(b) * np.linalg.norm(c))) if np.any(c) and np.any(b) else 0.0
    tied = cosine > collinear
    if tied:
        joint = np.stack([weighted[:, 0], b + gamma_ratio * c], axis=1)
        alpha, beta = _nnls(joint, ones)
        gamma = gamma_ratio * beta
    else:
        alpha, beta, gamma = _nnls(weighted, ones)
    result = Fit(Machine(alpha=float(alpha), beta=float(beta), gamma=float(gamma)), samples, tied,
                 held_out=held_out)
    result.bands = error_bands(result)
    parameters = 2 if tied else 3
    columns = joint if tied else weighted
    rank = int(np.linalg.matrix_rank(columns)) if len(samples) else 0
    if len(samples) <= parameters:
        result.warnings.append(f"under-determined: {len(samples)} rows for {parameters} parameters, so the fit "
                               f"matches its rows by construction and the error bands say nothing")
    elif rank < parameters:
        result.warnings.append(f"under-determined: the {len(samples)} rows give {rank} independent equations "
                               f"for {parameters} parameters (too few distinct algorithms, sizes or worlds)")
    for text in result.warnings:
        warnings.warn(f"ringcoll fit: {text}", UserWarning, stacklevel=2)
    return result


def fit(paths: Sequence[str] | str, **kwargs) -> Machine:
    """A flat :class:`ringcoll.Machine` fitted to ``ringcoll-bench`` JSON results (one path or
    several, any world sizes): joint non-negative α, β, γ over all collectives and sizes.
    ``fit_report(paths)`` gives the fit with its error per size band.

    >>> machine = ringcoll.fit(["bench/results/runs/20261202T144510Z_np4_gloo.json"])
    """
    return fit_report(paths, **kwargs).machine


def fit_report(paths: Sequence[str] | str, held_out: Sequence[str] = (), **kwargs) -> Fit:
    """The fit of :func:`fit` with its report; the rows of the ``held_out`` files are predicted
    and reported apart (out of sample), never fitted."""
    if isinstance(paths, str):
        paths = [paths]
    return fit_samples(samples_from_bench(paths), held_out=samples_from_bench(held_out), **kwargs)
