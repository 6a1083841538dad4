"""The "ringcoll" torch.distributed backend against gloo, in training code and call by call.

Every rank function runs on a live gloo cluster (``clusters(world)``): the cluster's default
group is gloo, and each function builds ringcoll groups beside it with
``dist.new_group(backend="ringcoll", pg_options=...)`` (cached per options, built in the same
order on every rank), so the two backends run the same code in the same processes.
"""
from __future__ import annotations

import datetime
import math
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ringcoll
from _util import CountingPlans
from _util import random_data as data
from ringcoll.runtime.executor import P2PExecutor

R = dist.ReduceOp
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
#: relative tolerance per float dtype: reductions in another order round differently
RTOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}

_groups: dict = {}


def ringcoll_group(ranks=None, **algorithms):
    """A ringcoll group over ``ranks`` (None: every rank), one per (ranks, algorithms) per
    process; every rank must ask for the same groups in the same order."""
    key = (tuple(ranks) if ranks else None, tuple(sorted(algorithms.items())))
    if key not in _groups:
        _groups[key] = dist.new_group(ranks, backend="ringcoll", pg_options=ringcoll.Options(**algorithms))
    return _groups[key]


def gloo_group(ranks):
    key = ("gloo", tuple(ranks))
    if key not in _groups:
        _groups[key] = dist.new_group(ranks, backend="gloo")
    return _groups[key]


def mlp(seed: int, width: int = 32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))


def batch(step: int, rank: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(8, 16, generator=gen).to(dtype), torch.randn(8, 4, generator=gen).to(dtype)


# -- DDP -------------------------------------------------------------------------------------
def ddp_trajectories(steps: int) -> dict:
    """Parameters after every step of DDP training, on gloo and on ringcoll with each
    all_reduce algorithm (``RINGCOLL_ALGO``); and the plans ringcoll ran."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    out = {}
    contestants = ["gloo"] + ringcoll.algorithms("all_reduce")
    saved = os.environ.get("RINGCOLL_ALGO")
    with CountingPlans() as counting:
        for name in contestants:
            # one ringcoll group (each new group pays its gloo connections); RINGCOLL_ALGO,
            # read at every call, picks the algorithm, as it does for the drop-ins
            group = None if name == "gloo" else ringcoll_group()
            os.environ["RINGCOLL_ALGO"] = f"all_reduce={name}" if name != "gloo" else ""
            model = mlp(seed=rank)     # different on each rank: DDP's broadcast must fix that
            ddp = DDP(model, process_group=group, bucket_cap_mb=0.004)   # 2 buckets of the 6.9 KB
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            history = []
            for step in range(steps):
                x, y = batch(step, rank)
                loss = nn.functional.mse_loss(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                history.append(torch.cat([p.detach().flatten() for p in model.parameters()]).clone())
            out[name] = torch.stack(history)
    if saved is None:
        os.environ.pop("RINGCOLL_ALGO", None)
    else:
        os.environ["RINGCOLL_ALGO"] = saved
    out["runs"] = counting.runs
    return out


def test_ddp_bitwise_across_ranks_and_close_to_gloo(clusters):
    steps = 20
    per_rank = clusters(4).run(ddp_trajectories, steps)
    algorithms = ringcoll.algorithms("all_reduce")
    for name in ["gloo"] + algorithms:
        first = per_rank[0][name]
        assert first.shape[0] == steps
        for rank, result in enumerate(per_rank[1:], 1):
            assert torch.equal(result[name], first), f"{name}: rank {rank}'s parameters differ from rank 0's"
    for name in algorithms:
        torch.testing.assert_close(per_rank[0][name], per_rank[0]["gloo"], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"all_reduce={name} vs gloo: {m}")
        # the schedules ran: DDP's buckets (several per step) were all-reduced by this algorithm
        assert per_rank[0]["runs"].get(f"all_reduce/{name}", 0) > steps, per_rank[0]["runs"]
    assert per_rank[0]["runs"].get("broadcast/linear", 0) + per_rank[0]["runs"].get("broadcast/binomial", 0) > 0
    assert per_rank[0]["runs"].get("all_gather/recursive_doubling", 0) > 0    # DDP's parameter check


def ddp_failing_backward() -> str:
    """A ringcoll all_reduce that fails inside DDP's backward (every rank's executor raises a
    PeerError, as for a dead peer): the error must reach Python on every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringcoll.runtime.failures import PeerError

    rank = dist.get_rank()
    ddp = DDP(mlp(seed=0), process_group=ringcoll_group())
    original = P2PExecutor.execute

    def execute(executor, plan, *args, **kwargs):
        if plan.collective == "all_reduce":
            raise PeerError(f"ringcoll {plan.describe}: rank {rank} step 1/1: receive from peer 1 failed: "
                            f"injected fault", rank=rank, peer=1, step=0)
        return original(executor, plan, *args, **kwargs)

    P2PExecutor.execute = execute
    try:
        x, y = batch(0, rank)
        nn.functional.mse_loss(ddp(x), y).backward()
    except Exception as error:  # noqa: BLE001 - what the test inspects
        return f"{type(error).__name__}: {error}"
    finally:
        P2PExecutor.execute = original
    return "no error"


def test_ddp_backward_raises_ringcolls_error(clusters):
    for message in clusters(2).run(ddp_failing_backward):
        assert "injected fault" in message and "ringcoll all_reduce/" in message, message
    # the cluster survived: the group still works afterwards
    assert clusters(2).run(allreduce_sum_once) == [3, 3]


def allreduce_sum_once() -> int:
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t, group=ringcoll_group())
    return int(t.item())


# -- FSDP2 -----------------------------------------------------------------------------------
def fsdp_losses(steps: int, dtype_name: str, hsdp: bool = False) -> dict:
    """Loss after each step of FSDP2 (fully_shard) training on gloo and on ringcoll; with
    ``hsdp`` a 2-D mesh (replicate x shard, 2 x world/2): ``init_device_mesh`` on a cluster
    whose default group is ringcoll, against the same mesh of gloo groups. bfloat16 runs set a gradient divide
    factor, so the reduce-scatter is PREMUL_SUM on ringcoll (gloo, which lacks PREMUL_SUM,
    runs the same factor as SUM then a division)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    out = {}
    with CountingPlans() as counting:
        for name in ("gloo", "ringcoll"):
            if hsdp and name == "ringcoll":     # the default group is ringcoll: unmodified mesh code
                mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
            elif hsdp:                          # the same mesh of gloo groups
                shard = world // 2
                shard_groups = [gloo_group(range(r * shard, (r + 1) * shard)) for r in range(2)]
                replicate_groups = [gloo_group(range(c, world, shard)) for c in range(shard)]
                mesh = DeviceMesh.from_group(
                    [replicate_groups[rank % shard], shard_groups[rank // shard]], "cpu",
                    mesh=torch.arange(world).view(2, shard), mesh_dim_names=("replicate", "shard"))
            else:
                mesh = DeviceMesh.from_group(dist.group.WORLD if name == "gloo" else ringcoll_group(), "cpu")
            model = mlp(seed=0)
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            if dtype == torch.bfloat16 and not hsdp:
                for module in model.modules():      # each fully_shard'ed layer has its own groups
                    if hasattr(module, "set_gradient_divide_factor"):
                        module.set_gradient_divide_factor(2.0 * world)
                        module.set_force_sum_reduction_for_comms(name == "gloo")
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            losses = []
            x, y = batch(0, rank)          # one batch per rank: the loss must fall
            for _step in range(steps):
                loss = nn.functional.mse_loss(model(x).float(), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            out[name] = losses
    out["runs"] = counting.runs
    return out


@pytest.fixture(scope="module")
def ringcoll_default():
    """4 ranks whose default group is ringcoll (``ringcoll.launch(4, "ringcoll")``)."""
    with ringcoll.launch(4, "ringcoll", timeout=float(os.environ.get("RINGCOLL_TEST_TIMEOUT", 120)),
                         threads=1, env={"RINGCOLL_TIMEOUT": "60"}) as cluster:
        yield cluster


@pytest.mark.parametrize("world,dtype_name", [(2, "float32"), (2, "bfloat16"), (4, "float32"), (4, "bfloat16")])
def test_fsdp2_loss_trajectory_matches_gloo(clusters, world, dtype_name):
    check_fsdp(clusters(world).run(fsdp_losses, 6, dtype_name), dtype_name, hsdp=False)


def test_hsdp_on_init_device_mesh_matches_gloo(ringcoll_default):
    check_fsdp(ringcoll_default.run(fsdp_losses, 6, "float32", True), "float32", hsdp=True)


def check_fsdp(per_rank, dtype_name, hsdp):
    tolerance = 1e-4 if dtype_name == "float32" else 3e-2
    for rank, result in enumerate(per_rank):
        ours, theirs = result["ringcoll"], result["gloo"]
        assert len(ours) == 6 and ours[-1] < ours[0], f"rank {rank} did not train: {ours}"
        for step, (a, b) in enumerate(zip(ours, theirs)):
            assert abs(a - b) <= tolerance * max(1.0, abs(b)), f"rank {rank} step {step}: {a} vs gloo {b}"
    runs = per_rank[0]["runs"]
    assert runs.get("all_gather/recursive_doubling", 0) > 0, runs
    assert any(key.startswith("reduce_scatter/") for key in runs), runs
    # the reduce ops FSDP2 picks reached ringcoll's schedules: AVG, or PREMUL_SUM with a factor
    assert ("PREMUL_SUM" if dtype_name == "bfloat16" else "AVG") in runs["ops"], runs
    if hsdp:
        assert any(key.startswith("all_reduce/") for key in runs), runs


# -- call by call against gloo ---------------------------------------------------------------
def ops_for(dtype):
    if dtype == torch.bool or dtype in INTS:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, "premul"]




def builtin(fn, tensor, op):
    """``fn(tensor, op)`` on the gloo default group, for what gloo lacks through an exact
    equivalent: int16 widened to int32, PREMUL_SUM(0.25) as SUM of the premultiplied input."""
    if tensor.dtype == torch.int16:
        return builtin(fn, tensor.to(torch.int32), op).to(torch.int16)
    ref = tensor.clone()
    if op == "premul":
        ref.mul_(0.25)
        op = R.SUM
    fn(ref, op, None)
    return ref


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in RTOL:
        return torch.allclose(a.double(), b.double(), rtol=RTOL[a.dtype], atol=RTOL[a.dtype])
    return torch.equal(a, b)


def compare_reductions() -> list:
    """all_reduce, reduce and reduce_scatter(_tensor) for every op x dtype at a size the world
    does not divide, and edge sizes, and sparse all_reduce; ringcoll's group against gloo's.
    The mismatches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = ringcoll_group()
    bad = []
    cases = [(d, op, world + 1) for d in FLOATS + INTS + (torch.bool,) for op in ops_for(d)]
    cases += [(torch.float32, R.SUM, n) for n in (0, 1, world - 1, 1000)]
    cases += [(torch.int64, R.BXOR, n) for n in (0, 1)]
    for dtype, op, numel in cases:
        real_op = dist._make_nccl_premul_sum(0.25) if op == "premul" else op
        x = data(rank, numel, dtype, seed=numel)
        # all_reduce
        ours = x.clone()
        dist.all_reduce(ours, op=real_op, group=group)
        ref = builtin(lambda t, o, g: dist.all_reduce(t, op=o, group=g), x, op)
        if not same(ours, ref):
            bad.append(f"all_reduce {dtype} {op} {numel}: {ours[:4]} vs {ref[:4]}")
        # reduce (the root's result)
        ours = x.clone()
        dist.reduce(ours, dst=world - 1, op=real_op, group=group)
        if rank == world - 1 and not same(ours, ref):
            bad.append(f"reduce {dtype} {op} {numel}: {ours[:4]} vs {ref[:4]}")
        # reduce_scatter_tensor and reduce_scatter (lists): block `rank` of the reduction
        block = data(rank, world * numel, dtype, seed=numel + 1)
        expect = builtin(lambda t, o, g: dist.all_reduce(t, op=o, group=g), block, op)[rank * numel:(rank + 1) * numel]
        out = torch.empty(numel, dtype=dtype)
        dist.reduce_scatter_tensor(out, block, op=real_op, group=group)
        if not same(out, expect):
            bad.append(f"reduce_scatter_tensor {dtype} {op} {numel}: {out[:4]} vs {expect[:4]}")
        out = torch.empty(numel, dtype=dtype)
        dist.reduce_scatter(out, list(block.clone().chunk(world)) if numel else
                            [torch.empty(0, dtype=dtype) for _ in range(world)], op=real_op, group=group)
        if not same(out, expect):
            bad.append(f"reduce_scatter {dtype} {op} {numel}: {out[:4]} vs {expect[:4]}")
    # sparse COO SUM (DDP's sparse gradients), plain and hybrid, overlapping indices
    for shape, dense in (((7,), ()), ((5, 3), (3,))):
        indices = torch.tensor([[rank % shape[0], (rank + 2) % shape[0], 4]])
        values = torch.arange(3 * math.prod(dense), dtype=torch.float32).view((3,) + dense) + rank
        ours = torch.sparse_coo_tensor(indices, values, shape)
        ref = ours.clone()
        dist.all_reduce(ours, group=group)
        dist.all_reduce(ref)
        if not torch.equal(ours.to_dense(), ref.to_dense()):
            bad.append(f"sparse all_reduce {shape}: {ours.to_dense()} vs {ref.to_dense()}")
    return bad


def wire(tensor: torch.Tensor) -> torch.Tensor:
    """The same bits in a dtype every gloo collective takes (gloo's gather refuses bool)."""
    if tensor.is_complex():
        return torch.view_as_real(tensor)
    return tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor


def compare_data_movement() -> list:
    """broadcast, all_gather(_into_tensor), gather, scatter, all_to_all(_single), barrier and
    point-to-point on the ringcoll group against gloo's, every dtype, edge sizes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = ringcoll_group()
    bad = []

    def check(what, ours, ref):
        ours = [wire(t) for t in (ours if isinstance(ours, list) else [ours])]
        ref = ref if isinstance(ref, list) else [ref]
        if len(ours) != len(ref) or not all(torch.equal(a, b) for a, b in zip(ours, ref)):
            bad.append(f"{what}: {ours} vs {ref}")

    for dtype in FLOATS + (torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64):
        for numel in (0, 1, world + 1, 257):
            x = data(rank, numel, dtype) if not dtype.is_complex else \
                torch.complex(data(rank, numel, torch.float32), data(rank + 9, numel, torch.float32))
            like = dtype if dtype != torch.int16 else torch.int32
            for root in (0, world - 1):
                ours, ref = x.clone(), wire(x.clone())
                dist.broadcast(ours, src=root, group=group)
                dist.broadcast(ref, src=root)
                check(f"broadcast {dtype} {numel} root {root}", ours, ref)
            ours = [torch.empty_like(x) for _ in range(world)]
            ref = [torch.empty_like(wire(x)) for _ in range(world)]
            dist.all_gather(ours, x, group=group)
            dist.all_gather(ref, wire(x))
            check(f"all_gather {dtype} {numel}", ours, ref)
            ours, ref = torch.empty(world * numel, dtype=x.dtype), wire(torch.empty(world * numel, dtype=x.dtype))
            dist.all_gather_into_tensor(ours, x, group=group)
            dist.all_gather_into_tensor(ref, wire(x))
            check(f"all_gather_into_tensor {dtype} {numel}", ours, ref)
            root = world - 1
            ours = [torch.empty_like(x) for _ in range(world)] if rank == root else None
            ref = [torch.empty_like(wire(x)) for _ in range(world)] if rank == root else None
            dist.gather(x, ours, dst=root, group=group)
            dist.gather(wire(x), ref, dst=root)
            if rank == root:
                check(f"gather {dtype} {numel}", ours, ref)
            pieces = [data(r + 3 * rank, numel, like).to(x.dtype) for r in range(world)] if rank == root else None
            ours, ref = torch.empty_like(x), wire(torch.empty_like(x))
            dist.scatter(ours, pieces, src=root, group=group)
            dist.scatter(ref, [wire(p) for p in pieces] if pieces else None, src=root)
            check(f"scatter {dtype} {numel}", ours, ref)
            if dtype != torch.bool:
                inputs = [data(10 * rank + r, numel, like).to(x.dtype) for r in range(world)]
                ours = [torch.empty_like(x) for _ in range(world)]
                dist.all_to_all(ours, inputs, group=group)
                # known values, not gloo's list all_to_all (torch 2.11's gloo has none): rank j
                # sends rank r its inputs[r], data(10 * j + r)
                ref = [wire(data(10 * j + rank, numel, like).to(x.dtype)) for j in range(world)]
                check(f"all_to_all {dtype} {numel}", ours, ref)
    # all_to_all_single with uneven splits (rank r sends r + j + 1 rows to rank j)
    send_splits = [rank + j + 1 for j in range(world)]
    recv_splits = [j + rank + 1 for j in range(world)]
    x = torch.arange(sum(send_splits) * 3, dtype=torch.float32).view(-1, 3) + 100 * rank
    ours = torch.empty(sum(recv_splits), 3)
    ref = torch.empty(sum(recv_splits), 3)
    dist.all_to_all_single(ours, x, recv_splits, send_splits, group=group)
    dist.all_to_all_single(ref, x, recv_splits, send_splits)
    check("all_to_all_single uneven", ours, ref)
    ours, ref = torch.empty(world * 2), torch.empty(world * 2)
    dist.all_to_all_single(ours, torch.arange(world * 2.) + rank, group=group)
    dist.all_to_all_single(ref, torch.arange(world * 2.) + rank)
    check("all_to_all_single equal", ours, ref)
    dist.barrier(group=group)
    # point to point, through the inner group: a ring, batch_isend_irecv, any source
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(3)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(rank)), right, group),
                                    dist.P2POp(dist.irecv, got, left, group)])
    for work in works:
        work.wait()
    check("batch_isend_irecv ring", got, torch.full((3,), float(left)))
    if rank == 0:
        sources = []
        for _ in range(world - 1):
            t = torch.empty(1)
            sources.append((dist.recv(t, group=group), int(t.item())))
        if sorted(sources) != [(r, 10 * r) for r in range(1, world)]:
            bad.append(f"recv from any source: {sources}")
    else:
        dist.send(torch.tensor([10. * rank]), 0, group=group)
    return bad


def compare_objects_async_subgroups() -> list:
    """Object collectives, async calls completing in order with their futures, Work.wait's
    timeout, and sub-groups (ranks outside get None, as gloo's)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = ringcoll_group()
    bad = []
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "pad": "x" * rank}, group=group)
    if objects != [{"rank": r, "pad": "x" * r} for r in range(world)]:
        bad.append(f"all_gather_object: {objects}")
    items = [f"from {rank}", rank] if rank == 1 else [None, None]
    dist.broadcast_object_list(items, src=1, group=group)
    if items != ["from 1", 1]:
        bad.append(f"broadcast_object_list: {items}")
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(("g", rank), gathered, dst=0, group=group)
    if rank == 0 and gathered != [("g", r) for r in range(world)]:
        bad.append(f"gather_object: {gathered}")
    got = [None]
    dist.scatter_object_list(got, [{"to": r} for r in range(world)] if rank == 0 else None, src=0, group=group)
    if got != [{"to": rank}]:
        bad.append(f"scatter_object_list: {got}")
    # async: several in flight, waited in reverse; futures resolve to the output tensors
    tensors = [torch.full((5 + i,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    for i, work in reversed(list(enumerate(works))):
        work.wait()
        value = work.get_future().wait()
        expect = torch.full((5 + i,), float(sum(range(world)) + world * i))
        if not (torch.equal(tensors[i], expect) and value[0] is tensors[i]):
            bad.append(f"async all_reduce {i}: {tensors[i]} (future {value})")
    # Work.wait(timeout) gives up on a collective a late peer has not joined
    t = torch.ones(2)
    if rank == 0:
        work = dist.all_reduce(t, group=group, async_op=True)
        began = time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=0.3))
            bad.append("wait(timeout) returned before the late peer joined")
        except RuntimeError as error:
            if "timed out" not in str(error) or time.monotonic() - began > 1.5:
                bad.append(f"wait(timeout): {error} after {time.monotonic() - began:.2f} s")
        work.wait()
    else:
        time.sleep(1.0)
        dist.all_reduce(t, group=group)
    if not torch.equal(t, torch.full((2,), float(world))):
        bad.append(f"late all_reduce: {t}")
    # a sub-group of ranks 0 and world-1, and ranks outside it
    members = [0, world - 1]
    sub, sub_gloo = ringcoll_group(members), gloo_group(members)
    x = torch.arange(7) * (rank + 2)
    ours, ref = x.clone(), x.clone()
    result = dist.all_reduce(ours, group=sub)
    dist.all_reduce(ref, group=sub_gloo)
    if rank in members and not torch.equal(ours, ref):
        bad.append(f"sub-group all_reduce: {ours} vs {ref}")
    if rank not in members and (result is not None or not torch.equal(ours, x)):
        bad.append("a rank outside the sub-group was touched")
    ours, ref = x.clone(), x.clone()
    dist.broadcast(ours, src=world - 1, group=sub)
    dist.broadcast(ref, src=world - 1, group=sub_gloo)
    if not torch.equal(ours, ref):
        bad.append(f"sub-group broadcast: {ours} vs {ref}")
    return bad


@pytest.mark.parametrize("check", [compare_reductions, compare_data_movement, compare_objects_async_subgroups])
def test_every_collective_matches_gloo(clusters, check):
    for rank, bad in enumerate(clusters(3).run(check)):
        assert bad == [], f"rank {rank}: {bad[:5]}"


# -- options, logging, errors ----------------------------------------------------------------
def options_and_log() -> dict:
    """What pg_options choose, what the log says, and bad arguments' errors."""
    import logging

    log = logging.getLogger("ringcoll")
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        group = ringcoll_group(all_reduce="ring", broadcast="binomial")
        with CountingPlans() as counting:
            dist.all_reduce(torch.ones(10), group=group)
            dist.broadcast(torch.ones(3), src=0, group=group)
            dist.all_reduce(torch.ones(10), group=ringcoll_group())          # auto
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    errors = []
    integers = torch.arange(4)
    for call in (lambda: dist.all_reduce(integers, op=R.AVG, group=group),
                 lambda: dist.all_gather([torch.empty(4, dtype=torch.int64)], integers, group=group)):
        try:
            call()
            errors.append("no error")
        except (TypeError, ValueError) as caught:
            errors.append(f"{type(caught).__name__}: {caught}")
    errors.append(integers.tolist())
    calls = [line for line in records if " -> " in line]        # not a group's placement line
    return {"runs": counting.runs, "log": calls, "errors": errors, "name": group.name(),
            "backend": dist.get_backend(group), "group_name": group.group_name}


def test_options_fix_algorithms_and_every_call_logs(clusters):
    result = clusters(2).run(options_and_log)[0]
    assert result["runs"] == {"all_reduce/ring": 1, "broadcast/binomial": 1,
                              "all_reduce/recursive_doubling": 1, "ops": {"SUM"}}, result["runs"]
    assert len(result["log"]) == 3, result["log"]
    assert result["log"][0].startswith("all_reduce/ring 10xfloat32 SUM: world 2, rank 0 -> ring"), result["log"]
    assert "broadcast/binomial" in result["log"][1] and "-> recursive_doubling (auto" in result["log"][2]
    assert result["name"] == "ringcoll" and result["backend"] == "ringcoll" and result["group_name"]
    # ringcoll's own checks reach the caller, before any tensor is touched
    avg, gather, untouched = result["errors"]
    assert avg.startswith("ValueError: op=ReduceOp.AVG needs a floating-point tensor"), avg
    assert gather.startswith("ValueError: tensor_list must hold one tensor per rank"), gather
    assert untouched == [0, 1, 2, 3]


def test_options_check_names():
    with pytest.raises(ValueError, match="all_reduce='nope'"):
        ringcoll.Options(all_reduce="nope")
    with pytest.raises(ValueError, match="collective must be one of"):
        ringcoll.Options(allreduce="ring")
    assert ringcoll.Options(all_reduce="ring").algorithm("all_reduce") == "ring"
    assert ringcoll.Options(all_gather="bruck").algorithm("all_gather_into_tensor") == "bruck"


# -- the comm hook ---------------------------------------------------------------------------
def hook_trajectories(steps: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    out = {}
    with CountingPlans() as counting:
        for name in ("built-in", "ring", "auto"):
            model = mlp(seed=rank)
            ddp = DDP(model, bucket_cap_mb=0.002)      # on the cluster's gloo default group
            if name != "built-in":
                ddp.register_comm_hook(None, ringcoll.ddp_comm_hook(name))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            for step in range(steps):
                x, y = batch(step, rank)
                opt.zero_grad()
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            out[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    out["runs"] = counting.runs
    return out


def test_ddp_comm_hook_on_gloo(clusters):
    per_rank = clusters(3).run(hook_trajectories, 5)
    for name in ("ring", "auto"):
        for rank in range(1, 3):
            assert torch.equal(per_rank[rank][name], per_rank[0][name])
        torch.testing.assert_close(per_rank[0][name], per_rank[0]["built-in"], rtol=1e-5, atol=1e-6)
    assert per_rank[0]["runs"].get("all_reduce/ring", 0) > 5, per_rank[0]["runs"]
    with pytest.raises(ValueError, match="nope"):
        ringcoll.ddp_comm_hook("nope")


def test_shutdown_joins_the_inner_groups_and_later_calls_say_so():
    """destroy_process_group calls shutdown(): queued calls finish first, the inner gloo group is
    shut down then (not left to interpreter exit, where a live gloo group aborted 1 run in ~10
    of tests/backend/test_backend_entry.py with `terminate called without an active exception`), and a
    call on the closed group raises naming what happened."""
    from ringcoll.backend import ProcessGroupRingcoll
    pg = ProcessGroupRingcoll(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    tensor = torch.tensor([3, 5], dtype=torch.int64)
    work = pg.allreduce([tensor])
    pg.shutdown()
    assert work.is_completed() and tensor.tolist() == [3, 5]
    with pytest.raises(RuntimeError, match="shut down"):
        pg.allreduce([tensor])
    aborted = ProcessGroupRingcoll(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    aborted.abort()
    with pytest.raises(RuntimeError, match="aborted"):
        aborted.broadcast([tensor])


def refused_backend_call_keeps_its_number():
    """On a ringcoll group in check mode, rank 0's scatter fails ringcoll's own checks (one
    tensor short) and rank 0 goes on to an all_reduce, while the other ranks post the scatter.
    The refused call must have taken its number at its entry, as a drop-in's does
    (docs/semantics.md#a-calls-number), so the check finds the numbers differ; when the backend's plans took their numbers where they
    ran, rank 0's all_reduce took the scatter's number and only the collective differed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["RINGCOLL_CHECK"] = "1"
    try:
        group = dist.new_group(list(range(world)), backend="ringcoll")   # its executor reads it
    finally:
        os.environ.pop("RINGCOLL_CHECK")
    out = {}
    try:
        if rank == 0:
            try:
                dist.scatter(torch.zeros(2), [torch.zeros(2)] * (world - 1), src=0, group=group)
            except ValueError as refused:
                out["refused"] = str(refused)
            dist.all_reduce(torch.ones(2), group=group)
        else:
            dist.scatter(torch.zeros(2), None, src=0, group=group)
        out["next"] = "returned"
    except Exception as error:  # noqa: BLE001 - what the test inspects
        out["next"] = f"{type(error).__name__}: {error}"
    return out


def test_a_refused_backend_call_takes_its_number_as_a_drop_ins_does(clusters):
    results = clusters(3).run(refused_backend_call_keeps_its_number)
    assert "scatter_list must hold one tensor per rank" in results[0].get("refused", ""), results[0]
    for rank, out in enumerate(results):
        assert "MismatchError" in out["next"] and "call number" in out["next"], (rank, out)
        assert "'scatter' on ranks [1, 2]" in out["next"] and "'all_reduce' on ranks [0]" in out["next"], (rank, out)
