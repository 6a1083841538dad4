"""Drop-in parity with torch.distributed: every public collective and point-to-point function
of torch has a ringcoll twin that accepts every parameter torch's accepts, with the same
defaults; torch 2.13's new names (``all_gather_single``, ``reduce_scatter_single``) and the
deprecated old ones behave as torch's.

The list of functions is derived from torch itself (``distributed_c10d.__all__``, the public
names torch.distributed re-exports), so the next
torch release's additions show up here as a failing test."""
from __future__ import annotations

import inspect
import types
import warnings

import torch
import torch.distributed as dist

import ringcoll
from _util import assert_every_rank

# -- the parity table -------------------------------------------------------------------------

#: torch.distributed's public functions that are not communication, or that ringcoll leaves to
#: torch on purpose; each with its reason. Any other public function that takes a ``group``
#: (or is a point-to-point call) must have a ringcoll twin.
EXCLUDED = {
    # group management and queries: ringcoll runs on torch's own process groups
    "new_group": "creates a process group; ringcoll's collectives run on torch's groups",
    "new_subgroups": "creates process groups (torch's)",
    "new_subgroups_by_enumeration": "creates process groups (torch's)",
    "split_group": "creates process groups (torch's)",
    "shrink_group": "rebuilds a process group (torch's), no communication of its own",
    "destroy_process_group": "group lifetime, torch's",
    "init_process_group": "group lifetime, torch's",
    "get_rank": "a query of torch's group, no communication",
    "get_world_size": "a query of torch's group, no communication",
    "get_backend": "a query of torch's group, no communication",
    "get_backend_config": "a query of torch's group, no communication",
    "get_group_rank": "a rank translation of torch's group, no communication",
    "get_global_rank": "a rank translation of torch's group, no communication",
    "get_process_group_ranks": "a query of torch's group, no communication",
    # gloo-only by name and definition: a barrier that reports the ranks that failed to arrive
    # by polling each peer over gloo; ringcoll's barrier already names a missing peer
    "monitored_barrier": "gloo-only by name: torch's gloo diagnostic barrier (ringcoll.barrier "
                         "names a missing peer itself)",
    # deprecated coalesced forms (FutureWarning in torch 2.13, no backend but gloo/NCCL's own)
    "all_reduce_coalesced": "deprecated by torch ('will be deprecated', FutureWarning)",
    "all_gather_coalesced": "deprecated by torch ('will be deprecated', FutureWarning)",
}


def torch_communication_functions() -> list:
    """torch.distributed's public functions (c10d's ``__all__``) that communicate: every function that
    takes a ``group`` parameter, minus :data:`EXCLUDED`, plus the point-to-point ones that take
    their group through ``P2POp`` (``batch_isend_irecv``)."""
    names = []
    for name in dist.distributed_c10d.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)     # reading dist.reduce_op warns
            fn = getattr(dist, name, None)
            if not isinstance(fn, types.FunctionType) or name in EXCLUDED:
                continue
        params = inspect.signature(fn).parameters
        if "group" in params or name == "batch_isend_irecv":
            names.append(name)
    return sorted(names)


def parity_problems(module) -> list:
    """What ``module`` lacks against torch.distributed: a missing twin, a parameter torch's
    has and the twin has not (or only as keyword-only where torch's is positional), or another
    default. Extra parameters of the twin must be keyword-only or have a default."""
    problems = []
    for name in torch_communication_functions():
        twin = getattr(module, name, None)
        if twin is None or not callable(twin):
            problems.append(f"{name}: no ringcoll twin")
            continue
        theirs = inspect.signature(getattr(dist, name)).parameters
        ours = inspect.signature(twin).parameters
        positional = [p for p in ours.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for index, (param, spec) in enumerate(theirs.items()):
            mine = ours.get(param)
            if mine is None:
                problems.append(f"{name}: no parameter {param!r}")
                continue
            if spec.kind == spec.POSITIONAL_OR_KEYWORD and (index >= len(positional)
                                                             or positional[index].name != param):
                problems.append(f"{name}: parameter {param!r} is not at position {index}")
            if mine.default != spec.default:
                problems.append(f"{name}: parameter {param!r} defaults to {mine.default!r}, torch's to "
                                f"{spec.default!r}")
        for param, spec in ours.items():
            if param not in theirs and spec.kind != spec.KEYWORD_ONLY and spec.default is spec.empty:
                problems.append(f"{name}: extra parameter {param!r} is required")
    return problems


def test_torch_functions_are_found():
    """The derivation finds the functions it must (a guard on the derivation itself)."""
    names = torch_communication_functions()
    for name in ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single", "gather_object",
                 "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier", "send_object_list"):
        assert name in names
    assert "monitored_barrier" not in names and "new_group" not in names
    # every exclusion names a real torch function, with a reason
    for name, reason in EXCLUDED.items():
        assert callable(getattr(dist, name)) and reason, name


def test_every_torch_function_has_a_twin_with_its_parameters_and_defaults():
    assert parity_problems(ringcoll) == []


def test_parity_fails_without_a_twin_or_a_parameter():
    """The check above can fail: a copy of ringcoll with a twin removed, one that lost a
    parameter, one with another default, one with an extra required parameter."""
    def copy_with(**replace):
        module = types.ModuleType("ringcoll_copy")
        module.__dict__.update({name: getattr(ringcoll, name) for name in dir(ringcoll) if not name.startswith("_")})
        for name, value in replace.items():
            if value is None:
                delattr(module, name)
            else:
                setattr(module, name, value)
        return module

    assert parity_problems(copy_with(gather_object=None)) == ["gather_object: no ringcoll twin"]

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, *, algorithm="auto"):     # no async_op
        pass

    assert parity_problems(copy_with(all_reduce=all_reduce)) == ["all_reduce: no parameter 'async_op'"]

    def broadcast(tensor, src=None, group=None, async_op=True, group_src=None):         # another default
        pass

    assert parity_problems(copy_with(broadcast=broadcast)) == \
        ["broadcast: parameter 'async_op' defaults to True, torch's to False"]

    def barrier(group=None, async_op=False, timeout=None, device_ids=None):             # order swapped
        pass

    problems = parity_problems(copy_with(barrier=barrier))
    assert "barrier: parameter 'device_ids' is not at position 2" in problems

    def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, extra=None,
                *, algorithm):    # extra parameters: with a default, or keyword-only
        pass

    def scatter_required(tensor, must, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
        pass

    assert parity_problems(copy_with(scatter=scatter)) == []
    problems = parity_problems(copy_with(scatter=scatter_required))
    assert "scatter: extra parameter 'must' is required" in problems


# -- torch 2.13's new names and the deprecated old ones -------------------------------------------

def _values(rank, numel, dtype):
    return ((torch.arange(numel, dtype=torch.int64) * 7 + rank * 13) % 61 + 1).to(dtype)


def new_and_old_names():
    """all_gather_single / reduce_scatter_single against torch's, in the concatenated and the
    stacked form; the old names give the same and warn as torch's do (FutureWarning)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for algorithm in ringcoll.algorithms("all_gather") + ["auto"]:
        tensor = _values(rank, 4, torch.int32).view(2, 2)
        want = torch.zeros(2 * world, 2, dtype=torch.int32)
        dist.all_gather_single(want, tensor)        # gloo takes the concatenated form only
        for shape in ((2 * world, 2), (world, 2, 2)):
            got = torch.zeros(shape, dtype=torch.int32)
            ringcoll.all_gather_single(got, tensor, algorithm=algorithm)
            out[f"all_gather_single {algorithm} {shape}"] = torch.equal(got.view(want.shape), want)
    for algorithm in ringcoll.algorithms("reduce_scatter") + ["auto"]:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            tensor = _values(rank, 6 * world, torch.float32).view(2 * world, 3)
            want = torch.zeros(2, 3)
            dist.reduce_scatter_single(want, tensor, op=op)
            for shape in ((2 * world, 3), (world, 2, 3)):
                got = torch.zeros(2, 3)
                ringcoll.reduce_scatter_single(got, tensor.view(shape), op=op, algorithm=algorithm)
                out[f"reduce_scatter_single {algorithm} {op} {shape}"] = torch.equal(got, want)
    for old, new, args in (
            ("all_gather_into_tensor", "all_gather_single",
             lambda: (torch.zeros(3 * world, dtype=torch.int64), _values(rank, 3, torch.int64))),
            ("reduce_scatter_tensor", "reduce_scatter_single",
             lambda: (torch.zeros(3, dtype=torch.int64), _values(rank, 3 * world, torch.int64)))):
        results, categories = {}, {}
        for who, fn in (("torch", getattr(dist, old)), ("ringcoll", getattr(ringcoll, old)),
                        ("ringcoll new", getattr(ringcoll, new))):
            call = args()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn(*call)
            results[who] = call[0].tolist()
            categories[who] = [(w.category, new in str(w.message), w.filename == __file__) for w in caught]
        out[f"{old}: same result"] = results["torch"] == results["ringcoll"] == results["ringcoll new"]
        out[f"{old}: FutureWarning naming {new}, at the caller"] = \
            categories["ringcoll"] == [(FutureWarning, True, True)] and categories["torch"][0][:2] == (FutureWarning, True)
        out[f"{new}: no warning"] = categories["ringcoll new"] == []
        out[f"{old}: async_op and algorithm forwarded"] = _forwarded(getattr(ringcoll, old), args())
    return out


def _forwarded(fn, call) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        work = fn(*call, async_op=True, algorithm="ring")
    return isinstance(work, ringcoll.Work) and work.wait() and work.result()[0] is not None


def test_new_names_match_builtin_and_old_names_warn_as_torch(clusters):
    assert_every_rank(clusters(3).run(new_and_old_names))


def test_new_names_in_the_simulator():
    world, numel = 5, 7
    for algorithm in ringcoll.algorithms("all_gather"):
        sim = ringcoll.simulate("all_gather_single", algorithm, world,
                                call=lambda r: ((torch.zeros(world * numel, dtype=torch.int64),
                                                 _values(r, numel, torch.int64)), {}))
        want = torch.cat([_values(r, numel, torch.int64) for r in range(world)])
        assert all(torch.equal(torch.cat(out), want) for out in sim.outputs), algorithm
    for algorithm in ringcoll.algorithms("reduce_scatter"):
        sim = ringcoll.simulate("reduce_scatter_single", algorithm, world,
                                call=lambda r: ((torch.zeros(numel, dtype=torch.int64),
                                                 _values(r, world * numel, torch.int64)), {}))
        total = sum(_values(r, world * numel, torch.int64) for r in range(world))
        for rank, (out,) in enumerate(sim.outputs):
            assert torch.equal(out, total[rank * numel:(rank + 1) * numel]), (algorithm, rank)
