"""Randomized differential testing: ringcoll against torch.distributed's built-ins.

    python -m tools.fuzz --trials 10000 --seed 1 --out bench/results/fuzz/fuzz.json
    python -m tools.fuzz --replay 1:4711          # one trial alone, with its details
    python -m tools.fuzz --simulate --trials 500  # in one process, against the exact reference

A trial is one call drawn from its id ``seed:index`` alone (so it replays alone): collective
× algorithm (``auto`` included) × op × dtype × world size × element count (0, 1, below the
world, not divisible, up to ``--max-bytes``) × root (given as a global or a group rank) ×
sub-group × ``async_op`` × contiguous or strided tensors × tensor lists that are separate
tensors or the chunks of one buffer × in place. Every rank of a launched gloo cluster (one
per world size, kept alive, many trials per ``Cluster.run``) runs the call on ringcoll and
the same call on the built-in, on the same group, and counts the elements where they
differ; where gloo has no built-in (int16, PREMUL_SUM, complex gather, all_to_all lists of
uneven sizes) an exact reference computed locally from every rank's input stands in. The
data are small integers, so every reduction is exact in every dtype and order (AVG is
compared within a dtype's rounding). Besides the values, a trial checks that no element
around an output was written (canaries), that ranks outside the group are untouched, and
that replicated results are bitwise identical on every rank.
"""
from __future__ import annotations

from .trials import (AVG_RTOL, COLLECTIVES, COMPLEX, DTYPES, FACTORS, FLOATS, INTS, PAD, Trial, draw,  # noqa: F401
                     ops_for, parse_worlds, sub_groups)
from .data import (Placed, builtin_lacks, count_wrong, inputs_of, place, reduce_all, reference,  # noqa: F401
                   values)
from .rank import REPLICATED, TrialsStopped, _Call, run_batch, run_trial  # noqa: F401
from .driver import Tally, run_trials  # noqa: F401
from .simulated import simulate_trial, simulate_trials  # noqa: F401
from .cli import main  # noqa: F401
