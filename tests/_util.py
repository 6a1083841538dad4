"""What the collective tests share: the worlds and dtypes they sweep, exact test data, the
built-in references (widened where gloo lacks a dtype or op), running plans in the simulator,
and the checks of a list of bad calls and of every rank's flags."""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable, Dict, Iterable, List, Tuple

import pytest
import torch
import torch.distributed as dist

R = dist.ReduceOp
#: the simulator tests' world sizes: every one to 17, then two larger powers of two
SIM_WORLDS = (*range(1, 18), 32, 64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: every dtype ringcoll moves
DTYPES = FLOATS + INTS + (torch.bool,)
#: relative tolerance per float dtype: reductions in another order round differently
RTOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The simulator moves many small tensors: torch's intra-op threads only contend for them.
    (Imported into a test module, it applies to that module.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- data -------------------------------------------------------------------------------------
def block_numels(world: int) -> List[int]:
    """The edge sizes of one rank's block: 0, 1, below the world, not divisible, large."""
    return sorted({0, 1, max(world - 1, 0), world + 1, 1000, 4099})


def block(rank: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s block: unique, never-zero values, so a misplaced element shows."""
    return torch.arange(numel, dtype=torch.int64) + 1 + rank * 1_000_003


def values(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Never-zero, exactly representable values, distinct across ranks."""
    raw = (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1
    if dtype == torch.bool:
        return raw % 3 != 0
    if dtype.is_floating_point:
        return (raw.to(torch.float64) * (0.5 if rank % 2 else -0.25)).to(dtype)
    return raw.to(dtype)


def random_data(rank: int, numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Never-zero data: small integers (exact under every op) or floats of either sign."""
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.rand(numel, generator=gen) < 0.6
    if dtype in INTS:
        return torch.randint(1, 4, (numel,), generator=gen).to(dtype)
    return (torch.rand(numel, generator=gen, dtype=torch.float64) * 1.5 + 0.5).to(dtype) * (
        1 - 2 * (torch.arange(numel) % 3 == 0).to(dtype))


def ops_for(dtype: torch.dtype) -> list:
    """Every ReduceOp torch allows on ``dtype`` (PREMUL_SUM by 0.25 on floats)."""
    if dtype.is_floating_point:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, dist._make_nccl_premul_sum(0.25)]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal for integers; within :data:`RTOL` for floats."""
    if got.dtype.is_floating_point:
        return torch.allclose(got.double(), want.double(), rtol=RTOL[got.dtype], atol=RTOL[got.dtype])
    return torch.equal(got, want)


# -- the built-ins, widened where gloo lacks a dtype or an op -----------------------------------
def builtin_all_reduce(tensor: torch.Tensor, op, group=None) -> torch.Tensor:
    """torch's all_reduce of a copy of ``tensor``; gloo has no int16 ("Invalid scalar type"):
    widened, exact for small data; nor PREMUL_SUM: the SUM of the premultiplied input."""
    if tensor.dtype == torch.int16:
        return builtin_all_reduce(tensor.to(torch.int32), op, group).to(torch.int16)
    ref = tensor.clone()
    if getattr(op, "op", op) == R.PREMUL_SUM:
        ref.mul_(0.25)
        op = R.SUM
    dist.all_reduce(ref, op=op, group=group)
    return ref


# -- the simulator ------------------------------------------------------------------------------
def run_world(collective: str, algorithm: str, world: int, make_call: Callable[[int], tuple]):
    """Every rank's plan on the tensors ``make_call(rank) -> (args, kwargs)`` returns, used as
    they are (aliasing kept, nothing copied); returns each rank's arguments and result."""
    from ringcoll.api import BUILDERS
    from ringcoll.api.common import Context
    from ringcoll.sim.engine import run_plans

    calls = [make_call(rank) for rank in range(world)]
    plans = [BUILDERS[collective](Context(rank, world), *args, algorithm=algorithm, **kwargs)
             for rank, (args, kwargs) in enumerate(calls)]
    with torch.no_grad():
        run_plans(plans)
    return [args for args, _ in calls], [plan.result for plan in plans]


#: a machine whose α, β and γ are of the same order at the tests' sizes, so a wrong term shows
COST_MACHINE = dict(alpha=5e-6, beta=1e-9, gamma=3e-10)


def cost_only(collective: str, algorithm: str, world: int, numel: int, **kwargs):
    """The simulator's cost-only run of the registry's ``collective`` on float32 (numel: the
    cost model's n in elements) on :data:`COST_MACHINE`."""
    import ringcoll
    from ringcoll.schedules.registry import builder_of

    return ringcoll.simulate(builder_of(collective), algorithm, world, numel=numel, dtype=torch.float32,
                             machine=ringcoll.Machine(**COST_MACHINE), data=False, record=False, **kwargs)


def _xor_of(world: int, numel: int) -> torch.Tensor:
    from ringcoll.api._calls import rank_data

    return functools.reduce(torch.bitwise_xor, [rank_data(r, numel) for r in range(world)])


def exact_results(collective: str, algorithm: str, world: int, numel: int, **kwargs):
    """Each rank's result of the registry's ``collective`` in the simulator on rank_data
    inputs (BXOR for the reductions; ``numel`` per block for the block collectives, the root
    world // 2), and the exact results: (got, want), one tensor per rank (reduce: the root's)."""
    import ringcoll
    from ringcoll.api._calls import rank_data

    if collective == "all_reduce":
        sim = ringcoll.simulate("all_reduce", algorithm, world, numel=numel, op=R.BXOR, **kwargs)
        return [out[0] for out in sim.outputs], [_xor_of(world, numel)] * world
    if collective == "reduce_scatter":
        full = [rank_data(r, world * numel) for r in range(world)]
        sim = ringcoll.simulate("reduce_scatter_tensor", algorithm, world, op=R.BXOR,
                                call=lambda r: ((torch.zeros(numel, dtype=torch.int64), full[r]), {}), **kwargs)
        total = functools.reduce(torch.bitwise_xor, full)
        return [out[0] for out in sim.outputs], [total[r * numel:(r + 1) * numel] for r in range(world)]
    if collective == "all_gather":
        sim = ringcoll.simulate("all_gather_into_tensor", algorithm, world,
                                call=lambda r: ((torch.zeros(world * numel, dtype=torch.int64),
                                                 rank_data(r, numel) * (r + 3)), {}), **kwargs)
        want = torch.cat([rank_data(r, numel) * (r + 3) for r in range(world)])
        return [torch.cat([v.reshape(-1) for v in out]) if numel else want[:0] for out in sim.outputs], [want] * world
    root = world // 2
    if collective == "broadcast":
        sim = ringcoll.simulate("broadcast", algorithm, world, numel=numel, src=root, **kwargs)
        return [out[0] for out in sim.outputs], [rank_data(root, numel)] * world
    if collective == "reduce":
        sim = ringcoll.simulate("reduce", algorithm, world, numel=numel, dst=root, op=R.BXOR, **kwargs)
        return [sim.outputs[root][0]], [_xor_of(world, numel)]
    raise ValueError(f"collective must be one of all_reduce, reduce_scatter, all_gather, broadcast, reduce, "
                     f"got {collective!r}")


# -- checks --------------------------------------------------------------------------------------
def assert_equal_per_rank(got: List[torch.Tensor], want: List[torch.Tensor], what: str = "") -> None:
    """Each rank's tensor equals its expected one, element for element; the message names what
    was run, the rank, the first element that differs and both values."""
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for rank, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what} rank {rank}: shape {tuple(g.shape)}, want {tuple(w.shape)}"
        if not torch.equal(g, w):
            i = int((g.reshape(-1) != w.reshape(-1)).nonzero()[0])
            raise AssertionError(f"{what} rank {rank} element {i}: got {g.reshape(-1)[i].item()}, "
                                 f"want {w.reshape(-1)[i].item()}")


def wrong_errors(cases: Dict[str, Tuple[type, Callable[[], object]]]) -> List[str]:
    """Runs each bad call ``name: (expected exception type, call)``; what went otherwise: no
    error, another type, or an empty message."""
    wrong = []
    for name, (kind, call) in cases.items():
        try:
            call()
        except kind as error:
            if not str(error):
                wrong.append(f"{name}: empty message")
        except Exception as error:  # noqa: BLE001 - reported
            wrong.append(f"{name}: {type(error).__name__} {error}")
        else:
            wrong.append(f"{name}: no error")
    return wrong


def assert_every_rank(results: Iterable) -> None:
    """Every rank's flags (a list, or a dict of named flags) are all true; the message names
    the rank and, for a dict, the flags that are not. No rank, or a rank with no flag, fails:
    a check that checked nothing passes nothing (#39)."""
    results = list(results)
    assert results, "no rank reported"
    for rank, flags in enumerate(results):
        assert len(flags) > 0, f"rank {rank} reported no flag"
        if isinstance(flags, dict):
            assert all(flags.values()), f"rank {rank}: {[k for k, ok in flags.items() if not ok]}"
        else:
            assert all(flags), f"rank {rank}: {flags}"


def assert_no_problems(results: Iterable[list]) -> None:
    """Every rank's list of problems is empty; the message names the rank and the first five."""
    for rank, problems in enumerate(results):
        assert not problems, f"rank {rank}: {problems[:5]}"


# -- watching ringcoll in a rank ----------------------------------------------------------------
class CountingPlans:
    """Counts the calls ringcoll's executor runs in this process while active (its one entry,
    ``P2PExecutor.execute``; internal exchanges on reserved tags not counted), by
    ``"collective/algorithm"``, and the ops of reducing plans under ``"ops"``."""

    def __enter__(self):
        from ringcoll.runtime.executor import P2PExecutor, Prepared

        self.runs: dict = {}
        self._execute = P2PExecutor.execute
        outer = self

        def execute(executor, call, *args, **kwargs):
            plan = call.plan if isinstance(call, Prepared) else call
            if kwargs.get("tag") is None:
                key = f"{plan.collective}/{plan.algorithm.name}"
                outer.runs[key] = outer.runs.get(key, 0) + 1
                words = plan.describe.split()          # "reduce_scatter_tensor/ring 40xfloat32 AVG"
                if plan.op is not None and len(words) > 2:
                    outer.runs.setdefault("ops", set()).add(words[2])
            return outer._execute(executor, call, *args, **kwargs)

        P2PExecutor.execute = execute
        return self

    def __exit__(self, *exc):
        from ringcoll.runtime.executor import P2PExecutor

        P2PExecutor.execute = self._execute

    def of(self, collective: str) -> int:
        """Plans run of ``collective``, any algorithm."""
        return sum(count for key, count in self.runs.items() if key.split("/")[0] == collective)


@contextlib.contextmanager
def ringcoll_log():
    """The messages ringcoll logs at INFO and above while active (a list, filled as they come)."""
    records: list = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    log = logging.getLogger("ringcoll")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def environment(values: Dict[str, object]):
    """``os.environ`` with ``values`` (a name -> its text, or None: unset) while active, each
    variable restored afterwards (ringcoll re-reads its settings at every call)."""
    from ringcoll.config import environment

    return environment(values)


@contextlib.contextmanager
def group_timeouts():
    """The groups' own timeouts while active: RINGCOLL_TIMEOUT unset (the test clusters set it)
    and no ``ringcoll.set_timeout`` override (an earlier test's may linger in a kept rank)."""
    from ringcoll.runtime import failures

    saved = failures._timeout_override
    failures._timeout_override = None
    try:
        with environment({"RINGCOLL_TIMEOUT": None}):
            yield
    finally:
        failures._timeout_override = saved


def bench_json(path, machine, world: int, rows_of) -> str:
    """A ringcoll-bench-shaped JSON whose times are the closed forms on ``machine`` (+1 %
    on every other row, so a fit cannot match every row): ``rows_of`` (family, algorithm,
    bytes)."""
    import json

    from ringcoll.schedules import registry
    from ringcoll.sim.fit import Sample, coefficients

    rows = []
    for i, (family, algorithm, size) in enumerate(rows_of):
        a, b, c = coefficients(Sample(family, algorithm, world, size, 0.0))
        seconds = (a * machine.alpha + b * machine.beta + c * machine.gamma) * (1.01 if i % 2 else 1.0)
        rows.append({"collective": registry.builder_of(family), "algorithm": algorithm, "count": size // 4,
                     "type": "float32", "time_us": seconds * 1e6, "error": None})
    with open(path, "w") as f:
        json.dump({"meta": {"world_size": world}, "rows": rows}, f)
    return str(path)


#: rows of :func:`bench_json`: two all_reduce algorithms and a broadcast at three sizes
MANY = [(f, a, s) for f, names in (("all_reduce", ("ring", "recursive_doubling")), ("broadcast", ("binomial",)))
        for a in names for s in (1024, 65536, 1 << 22)]
