"""What differs between the torch versions ringcoll runs on, checked on whichever one is installed.

PREMUL_SUM's factor lives in two places: torch 2.13 has ``op.factor``; torch 2.11 (the GPU image's)
has no ``factor`` attribute, only ``op.__getstate__() == (RedOpType.PREMUL_SUM, factor)``. Every
test here runs the installed torch's real op, and a stand-in shaped as 2.11's (a subclass of the
real ReduceOp whose ``factor`` raises AttributeError as 2.11's does), so both shapes are checked
under any torch; ``python -m tools.compat`` runs this file under 2.11 itself.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringcoll
from ringcoll import ops

R = dist.ReduceOp


class Torch211PremulOp(R):
    """A PREMUL_SUM ReduceOp as torch 2.11 builds it: the factor only in its pickled state."""

    @property
    def factor(self):
        raise AttributeError("'torch._C._distributed_c10d.ReduceOp' object has no attribute 'factor'")


def premul_211(factor) -> R:
    op = Torch211PremulOp.__new__(Torch211PremulOp)
    op.__setstate__((R.PREMUL_SUM, factor))
    return op


def real_premul(factor) -> R:
    return dist._make_nccl_premul_sum(factor)


def through_options(op, options_type) -> R:
    """The op as a backend receives it: set on torch's options, read back (a new object)."""
    options = options_type()
    options.reduceOp = op
    return options.reduceOp


SHAPES = {"installed": real_premul, "2.11-shaped": premul_211}


def test_the_stand_in_refuses_factor_as_torch_2_11_does():
    op = premul_211(0.5)
    with pytest.raises(AttributeError, match="has no attribute 'factor'"):
        op.factor  # noqa: B018 - the attribute access is what must raise
    assert op.op == R.PREMUL_SUM
    assert op.__getstate__() == (R.PREMUL_SUM, 0.5)


def test_installed_torch_has_one_of_the_two_known_shapes():
    op = real_premul(0.5)
    assert op.__getstate__() == (R.PREMUL_SUM, 0.5), f"torch {torch.__version__}: {op.__getstate__()!r}"
    try:
        factor = op.factor
    except AttributeError:          # torch 2.11's shape
        return
    assert factor == 0.5, f"torch {torch.__version__}: op.factor is {factor!r}, want 0.5"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("factor", [0.25, 3.0])
def test_premul_factor_reads_a_number(shape, factor):
    got = ops.premul_factor(SHAPES[shape](factor))
    assert got == factor, f"{shape}: premul_factor gave {got!r}, want {factor}"


@pytest.mark.parametrize("shape", SHAPES)
def test_premul_factor_reads_a_tensor(shape):
    got = ops.premul_factor(SHAPES[shape](torch.tensor(0.25)))
    assert isinstance(got, torch.Tensor) and got.item() == 0.25, f"{shape}: premul_factor gave {got!r}"


@pytest.mark.parametrize("options_type", [dist.AllreduceOptions, dist.ReduceScatterOptions],
                         ids=lambda t: t.__name__)
def test_premul_factor_after_a_round_trip_through_options(options_type):
    op = through_options(real_premul(0.5), options_type)
    assert ops.premul_factor(op) == 0.5, f"after {options_type.__name__}: {op.__getstate__()!r}"
    spec = ops.resolve(op, torch.zeros(2))
    assert (spec.name, spec.premul) == ("PREMUL_SUM", 0.5), spec


@pytest.mark.parametrize("op", [R.SUM, R.AVG, R(R.SUM), R(R.MAX)], ids=["SUM", "AVG", "ReduceOp(SUM)",
                                                                       "ReduceOp(MAX)"])
def test_premul_factor_is_none_for_every_other_op(op):
    # torch 2.13 raises RuntimeError (not AttributeError) on ReduceOp(SUM).factor
    assert ops.premul_factor(op) is None
    assert ops.resolve(op, torch.zeros(2)).premul is None


def test_every_bench_spec_has_a_builtin_on_this_torch():
    """ringcoll-bench times torch's built-in beside ringcoll: torch 2.11 has no
    all_gather_single/reduce_scatter_single, only all_gather_into_tensor/reduce_scatter_tensor."""
    from ringcoll.bench import harness, specs

    for name, spec in specs.SPECS.items():
        builtin = harness._builtin(spec)
        assert callable(builtin), f"torch {torch.__version__}: {name}'s built-in is {builtin!r}"


@pytest.mark.parametrize("shape", SHAPES)
def test_resolve_premul_sum(shape):
    spec = ops.resolve(SHAPES[shape](0.25), torch.zeros(2))
    assert (spec.name, spec.local, spec.premul, spec.average) == ("PREMUL_SUM", "sum", 0.25, False), spec


@pytest.mark.parametrize("shape", SHAPES)
def test_resolve_reads_each_tensor_factor_anew(shape):
    """resolve caches by op, dtype and factor; a tensor factor is no key: two tensors, two specs."""
    first = ops.resolve(SHAPES[shape](torch.tensor(0.5)), torch.zeros(2))
    second = ops.resolve(SHAPES[shape](torch.tensor(0.25)), torch.zeros(2))
    assert (first.premul, second.premul) == (0.5, 0.25), (first, second)


@pytest.mark.parametrize("shape", SHAPES)
def test_premul_on_integers_is_still_refused(shape):
    with pytest.raises(ValueError, match="op=ReduceOp.PREMUL_SUM needs a floating-point tensor"):
        ops.resolve(SHAPES[shape](2.0), torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter_single"])
def test_premul_sum_runs_in_the_simulator(shape, collective):
    world, numel = 3, 12
    data = [torch.arange(numel, dtype=torch.float32) + 100 * rank for rank in range(world)]
    want = sum(x * 0.5 for x in data)
    if collective == "all_reduce":
        inputs, wants = data, [want] * world
    else:
        inputs = [(torch.zeros(numel // world), x) for x in data]
        wants = list(want.chunk(world))
    sim = ringcoll.simulate(collective, "ring", world, inputs=inputs, op=SHAPES[shape](0.5))
    for rank, outputs in enumerate(sim.outputs):
        assert torch.equal(outputs[0], wants[rank]), \
            f"{shape} {collective} rank {rank}: got {outputs[0]}, want {wants[rank]}"
