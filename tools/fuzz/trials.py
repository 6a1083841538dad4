"""A trial: one call drawn from its id ``seed:index`` alone (what it calls, on which ranks,
with what data shape), and the dtypes and ops it draws from."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


#: drop-in -> (rooted, reducing); its algorithms are its registry collective's (registry.collective_of)
COLLECTIVES = {
    "all_reduce": (False, True),
    "reduce": (True, True),
    "broadcast": (True, False),
    "all_gather": (False, False),
    "all_gather_single": (False, False),
    "reduce_scatter": (False, True),
    "reduce_scatter_single": (False, True),
    "gather": (True, False),
    "scatter": (True, False),
    "all_to_all": (False, False),
    "all_to_all_single": (False, False),
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
COMPLEX = ("complex64", "complex128")
DTYPES = FLOATS + INTS + ("bool",) + COMPLEX
#: PREMUL_SUM factors that keep sums of small integers exact in every float dtype
FACTORS = (0.25, 0.75, 2.0, 3.0)
#: AVG's tolerance: the built-in may round its one division differently
AVG_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-13,
            "complex64": 1e-6, "complex128": 1e-13}
PAD = 3                     # canary elements before and after every output


def ops_for(dtype: str) -> Tuple[str, ...]:
    if dtype in COMPLEX:
        return ("SUM", "AVG", "PREMUL_SUM")
    if dtype in FLOATS:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


@dataclass
class Trial:
    id: str
    collective: str
    algorithm: str
    dtype: str
    world: int
    numel: int                      # per-rank block (the whole vector for all_reduce, reduce, broadcast)
    op: Optional[str] = None
    factor: Optional[float] = None
    root: int = 0                   # group rank
    root_as: str = "global"         # how ringcoll is given the root: "global" or "group"
    members: Optional[List[int]] = None   # the sub-group's global ranks (None: the whole world)
    async_op: bool = False
    contiguous: bool = True
    chunks: bool = False            # tensor lists as the chunks of one buffer
    in_place: bool = False
    counts: Optional[List[List[int]]] = None   # all_to_all: counts[g][h] elements g sends h

    @property
    def group_size(self) -> int:
        return len(self.members) if self.members else self.world


def parse_worlds(text: str) -> List[int]:
    if "-" in text:
        low, high = (int(part) for part in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(part) for part in text.split(",")]


def sub_groups(world: int) -> List[List[int]]:
    """The few sub-groups a world draws from (each costs a new gloo group on every rank)."""
    if world < 3:
        return []
    return [list(range(1, world)), list(range(0, world, 2)), [0, world - 1]]


def draw(seed: int, index: int, worlds: List[int], max_bytes: int) -> Trial:
    """The trial ``seed:index``, a function of its id alone."""
    trial_id = f"{seed}:{index}"
    rng = random.Random(f"ringcoll-fuzz:{trial_id}")
    import ringcoll
    from ringcoll.schedules.registry import collective_of

    collective = rng.choice(sorted(COLLECTIVES))
    rooted, reducing = COLLECTIVES[collective]
    family = collective_of(collective)
    world = rng.choice(worlds)
    members = None
    if rng.random() < 0.2 and sub_groups(world):
        members = rng.choice(sub_groups(world))
    size = len(members) if members else world
    dtype = rng.choice(DTYPES)
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # the element count: the edges often, a size up to max_bytes (of the whole call) sometimes
    total_blocks = size if collective in ("all_gather", "all_gather_single", "reduce_scatter",
                                          "reduce_scatter_single", "gather", "scatter") else 1
    kind = rng.random()
    if kind < 0.1:
        numel = 0
    elif kind < 0.2:
        numel = 1
    elif kind < 0.3:
        numel = max(size - 1, 1)
    elif kind < 0.4:
        numel = size + 1
    elif kind < 0.8:
        numel = rng.randint(2, 300)
    elif kind < 0.97:
        numel = rng.randint(300, 20000)
    else:
        numel = rng.randint(1, max(1, max_bytes // (itemsize * total_blocks)))
    numel = min(numel, max(1, max_bytes // (itemsize * total_blocks)))
    trial = Trial(trial_id, collective, "auto", dtype, world, numel, members=members)
    names = ringcoll.algorithms(family)
    trial.algorithm = rng.choice(names + ["auto"])
    if reducing:
        trial.op = rng.choice(ops_for(dtype))
        if trial.op == "PREMUL_SUM":
            trial.factor = rng.choice(FACTORS)
    if rooted:
        trial.root = rng.randrange(size)
        trial.root_as = rng.choice(("global", "group"))
    trial.async_op = rng.random() < 0.3
    trial.contiguous = rng.random() < 0.7
    trial.chunks = rng.random() < 0.4
    if collective in ("all_gather_single", "reduce_scatter_single"):
        trial.in_place = rng.random() < 0.3
    if collective.startswith("all_to_all"):
        if rng.random() < 0.5:       # equal blocks
            trial.counts = [[numel] * size for _ in range(size)]
        else:
            high = max(1, min(numel, 2000))
            trial.counts = [[rng.randint(0, high) for _ in range(size)] for _ in range(size)]
        equal = len({c for row in trial.counts for c in row}) == 1
        if trial.algorithm == "bruck" and not equal:      # bruck forwards blocks: equal ones only
            trial.algorithm = "pairwise"
    return trial
