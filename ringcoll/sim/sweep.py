"""Sweeps: every algorithm of some collectives over world sizes and message sizes on a
machine, the best algorithm of each cell, the sizes where the best changes, and a map.

Up to ``simulate_up_to`` ranks every cell is a cost-only simulation on the machine's clock
(ports, nodes and NICs included); beyond, the closed forms serve, on the machine's slowest
link and, for the node-aware algorithms, its nodes (they equal the clock on a flat
single-port machine, validated up to 1024 ranks by the tests and bench/study_scale.py). Each
cell also carries its ratio to the lower bound
T_lb = ⌈lg p⌉α + (bandwidth bound)β + (compute bound)γ on the machine's fastest link.
"""
from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..schedules import registry
from ..selection import segment_bytes
from .machine import Machine
from ..runtime.nodes import model_local_size
from .bounds import lower_bounds

#: the builder each registry collective is simulated through
_BUILDER = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
            "all_to_all": "all_to_all_single"}


@dataclass
class Cell:
    collective: str
    algorithm: str
    world: int
    nbytes: int
    seconds: float
    bound_ratio: float          # seconds / the lower-bound time
    source: str                 # "simulated" or "closed form"


def bound_time(collective: str, world: int, nbytes: int, machine: Machine) -> float:
    bound = lower_bounds(collective, world, nbytes)
    alpha = min(machine.alpha, machine.inter_alpha) if not machine.flat else machine.alpha
    beta = min(machine.beta, machine.inter_beta) if not machine.flat else machine.beta
    return bound.steps * alpha + bound.bytes_moved * beta / machine.ports + bound.bytes_reduced * machine.gamma


def evaluate(collective: str, algorithm: str, world: int, nbytes: int, machine: Machine,
             simulate_up_to: int = 256) -> Cell:
    from .simulate import simulate

    # on a hierarchical machine the node-aware algorithms and their closed forms see the
    # machine's own nodes
    nodes = None if machine.flat else tuple(machine.node_of(rank) for rank in range(world))
    if world <= simulate_up_to:
        sim = simulate(_BUILDER.get(collective, collective), algorithm, world, numel=max(nbytes // 4, 0),
                       dtype=__import__("torch").float32, data=False, machine=machine, record=False,
                       local_size=nodes)
        seconds, source = sim.stats.time, "simulated"
    else:
        cost = registry.model(registry.get(collective, algorithm), world, nbytes,
                              segment=segment_bytes(collective, algorithm), local_size=model_local_size(nodes))
        seconds, source = cost.on(machine), "closed form"
    lb = bound_time(collective, world, nbytes, machine)
    return Cell(collective, algorithm, world, nbytes, seconds, seconds / lb if lb else float("nan"), source)


def sweep(collectives: Sequence[str], worlds: Sequence[int], sizes: Sequence[int], machine: Machine,
          algorithms: Optional[Sequence[str]] = None, simulate_up_to: int = 256,
          progress=None) -> List[Cell]:
    cells = []
    for collective in collectives:
        names = [a for a in registry.algorithms(collective) if algorithms is None or a in algorithms]
        for world in worlds:
            # an algorithm registered for one world size (a loaded MSCCL program) runs there only
            runnable = [name for name in names if registry.get(collective, name).world in (None, world)]
            for nbytes in sizes:
                for name in runnable:
                    cells.append(evaluate(collective, name, world, nbytes, machine, simulate_up_to))
                    if progress:
                        progress()
    return cells


def best(cells: Iterable[Cell]) -> Dict[Tuple[str, int, int], Cell]:
    """The fastest algorithm of each (collective, world, nbytes)."""
    winners: Dict[Tuple[str, int, int], Cell] = {}
    for cell in cells:
        key = (cell.collective, cell.world, cell.nbytes)
        if key not in winners or cell.seconds < winners[key].seconds:
            winners[key] = cell
    return winners


def crossovers(cells: Iterable[Cell]) -> List[Tuple[str, int, int, str, str]]:
    """(collective, world, first size of the new winner, old winner, new winner) wherever the
    best algorithm changes as the size grows."""
    winners = best(cells)
    out = []
    for collective, world in sorted({(c, w) for c, w, _ in winners}):
        sizes = sorted(n for c, w, n in winners if (c, w) == (collective, world))
        for before, after in zip(sizes, sizes[1:]):
            a, b = winners[(collective, world, before)], winners[(collective, world, after)]
            if a.algorithm != b.algorithm:
                out.append((collective, world, after, a.algorithm, b.algorithm))
    return out


def write_table(cells: Sequence[Cell], path: str) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(cells[0])))
        writer.writeheader()
        for cell in cells:
            writer.writerow(asdict(cell))
    return path


def _size_label(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def plot_map(cells: Sequence[Cell], collective: str, path: str, title: str = "") -> str:
    """Heatmap over world size (rows) and message size (columns): the best algorithm's
    colour, each cell marked with its time's ratio to the lower bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    winners = {k: v for k, v in best(cells).items() if k[0] == collective}
    worlds = sorted({w for _, w, _ in winners})
    sizes = sorted({n for _, _, n in winners})
    names = sorted({c.algorithm for c in winners.values()})
    colours = plt.get_cmap("tab10").colors
    grid = [[names.index(winners[(collective, w, n)].algorithm) for n in sizes] for w in worlds]
    fig, ax = plt.subplots(figsize=(1.0 * len(sizes) + 3, 0.55 * len(worlds) + 2))
    ax.imshow(grid, cmap=ListedColormap(colours[:len(names)]), vmin=-0.5, vmax=len(names) - 0.5,
              aspect="auto", origin="lower")
    for i, w in enumerate(worlds):
        for j, n in enumerate(sizes):
            ax.text(j, i, f"{winners[(collective, w, n)].bound_ratio:.2g}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([_size_label(n) for n in sizes], rotation=45)
    ax.set_yticks(range(len(worlds)))
    ax.set_yticklabels([str(w) for w in worlds])
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("ranks")
    ax.legend(handles=[Patch(color=colours[i], label=name) for i, name in enumerate(names)],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(title or f"{collective}: best algorithm (number: time / lower bound)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
