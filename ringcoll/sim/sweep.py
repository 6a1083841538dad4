"""Sweeps: every algorithm of some collectives over world sizes and message sizes on a
machine, the best algorithm of each cell, the sizes where the best changes, and a map.

Up to ``simulate_up_to`` ranks every cell is a cost-only simulation on the machine's clock
(ports, nodes and NICs included); beyond, the closed forms serve where they are the clock's
(:func:`closed_form`): they equal it on a flat single-port machine (validated up to 1024 ranks
by the tests and bench/study_scale.py), with k ports for the algorithms that never post two
messages from or to one rank in a step, and on ranks of a single node; elsewhere (a 2-level
machine's ranks on several nodes, several ports taken by one step) the sweep refuses the
cells with a ValueError naming them, before it runs. Each cell says which (``source``), and
the crossovers and maps mark the closed-form ones. Each cell also carries its ratio to the
lower bound (:func:`bound_time`): on a flat machine T_lb = ⌈log_(1+k) p⌉α + (bandwidth
bound)β/k + (compute bound)γ with k ports; on a 2-level machine the larger of that at the
fastest link and the bound across the node boundary at the inter-node link
(:func:`ringcoll.sim.bounds.node_bounds`). Cells within :data:`TIE` of the best are ties,
flagged on the maps and in the crossovers.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..schedules import registry
from ..schedules.registry import builder_of
from ..schedules.vocabulary import Send
from ..selection import segment_bytes
from ..cost.machine import Machine
from ..runtime.nodes import model_local_size
from .bounds import lower_bounds, node_bounds

#: relative difference in time below which two algorithms tie in a cell
TIE = 1e-9
#: a closed form is used above ``simulate_up_to`` only where each rank's share of the vector
#: holds at least this many float32 elements: below, chunks go empty and the clock skips
#: their messages, which the closed forms still count (up to 3x slower than the clock)
MIN_SHARE = 8
#: relative difference between a closed form the sweep uses and the clock's time at the same
#: cell (tests/sim/test_sweep_exact.py; docs/simulator.md says why): the closed forms count a
#: rank's share as n/p bytes, the clock moves whole elements
CLOSED_FORM_TOLERANCE = 1e-3


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
    """The lower bound on ``machine``: Chan et al.'s at the fastest link with the machine's
    ports (⌈log_(1+k) p⌉ α, bytes ÷ k: :func:`ringcoll.sim.bounds.lower_bounds`), and on a
    2-level machine at least the node boundary's (inter-node rounds and NIC bytes at the
    inter-node α and β), whichever is larger."""
    bound = lower_bounds(collective, world, nbytes, machine.ports)
    alpha = min(machine.alpha, machine.inter_alpha) if not machine.flat else machine.alpha
    beta = min(machine.beta, machine.inter_beta) if not machine.flat else machine.beta
    flat = bound.steps * alpha + bound.bytes_moved * beta + bound.bytes_reduced * machine.gamma
    if machine.flat:
        return flat
    across = node_bounds(collective, world, nbytes, [machine.node_of(r) for r in range(world)], machine.nic_ports)
    return max(flat, across.steps * machine.inter_alpha + across.bytes_moved * machine.inter_beta)


@functools.lru_cache(maxsize=1024)
def most_per_step(collective: str, algorithm: str, world: int, nbytes: int) -> int:
    """The most sends, or receives, that one rank posts in one step of ``algorithm`` at
    ``world`` ranks and ``nbytes`` (float32, as the sweep simulates it): rank 0's plan's layout,
    every rank's schedule, or only the representatives where the algorithm declares a symmetry
    (:func:`ringcoll.sim.engine.symmetric`: the others' steps are theirs relabelled)."""
    import torch
    from ..api._calls import uniform_plans
    from ..api.common import Context
    from .engine import symmetric

    plans = uniform_plans(builder_of(collective), world, max(nbytes // 4, 0), torch.float32,
                          {"algorithm": algorithm}, Context(0, world))
    first = plans[0]
    found = symmetric(plans, Machine())
    most = 0
    for rank in range(found[1] if found else world):
        for step in first.algorithm.schedule(rank, world, first.layout):
            sends = sum(isinstance(comm, Send) for comm in step.comms)
            most = max(most, sends, len(step.comms) - sends)
            if most > 1:
                return most
    return most


def closed_form_refusal(collective: str, algorithm: str, world: int, nbytes: int, machine: Machine) -> Optional[str]:
    """Why ``algorithm``'s closed form is not the clock's time on ``machine`` at ``world``
    ranks, or None where it is, within :data:`CLOSED_FORM_TOLERANCE` (so the sweep may use
    it above ``simulate_up_to``). A closed form counts every message at one α and β on a
    single port, and a rank's share as n/p bytes: below :data:`MIN_SHARE` elements per rank
    it is refused on any machine. On a 2-level machine whose
    ``world`` ranks span several nodes the clock prices each message at its own link and
    queues a node's messages on its NIC: no closed form says which messages cross or share,
    so every one is refused (ranks on one node: the intra-node link's closed form, exact).
    With k > 1 ports per rank, an algorithm that posts several sends or receives in one step
    runs them side by side on the clock, which its closed form serialises: refused; one that
    never does (:func:`most_per_step`) leaves every port but one idle, so the clock is the
    single-port one and its closed form exact. A network machine routes each message over
    links it shares with others, and a LogGP machine (o, g, L) or a window above 1 overlaps
    what the closed forms add up: no closed form is the clock's there, so all are refused."""
    where = f"{collective}/{algorithm} at {world} ranks on {machine.describe()}"
    if nbytes // 4 < MIN_SHARE * world:
        return (f"{where}: {nbytes} B is under {MIN_SHARE} float32 elements per rank, where chunks go "
                f"empty and the clock skips their messages; simulate it (simulate_up_to >= {world})")
    if machine.network is not None:
        return (f"{where}: no closed form gives the clock's time on a network machine (messages take "
                f"routes of several links and share them); simulate it (simulate_up_to >= {world})")
    if machine.is_loggp or machine.window > 1:
        return (f"{where}: the closed forms charge α per message one step at a time, where this machine's "
                f"o, g, L and window of {machine.window} overlap them; simulate it (simulate_up_to >= {world})")
    if not machine.flat and len(set(machine.nodes(world))) > 1:
        return (f"{where}: no closed form gives the clock's time on a 2-level machine (its links "
                f"differ and a node's messages share its NIC); simulate it (simulate_up_to >= {world})")
    if machine.ports > 1 and most_per_step(collective, algorithm, world, nbytes) > 1:
        return (f"{where}: it posts several messages from or to one rank in a step, which "
                f"{machine.ports} ports carry side by side and its single-port closed form serialises; "
                f"simulate it (simulate_up_to >= {world})")
    return None


def closed_form(collective: str, algorithm: str, world: int, nbytes: int, machine: Machine) -> float:
    """``algorithm``'s closed-form seconds on ``machine``, or a ValueError naming the algorithm
    and the machine where it would not be the clock's (:func:`closed_form_refusal`)."""
    refusal = closed_form_refusal(collective, algorithm, world, nbytes, machine)
    if refusal:
        raise ValueError(refusal)
    nodes = machine.nodes(world)
    cost = registry.model(registry.get(collective, algorithm), world, nbytes,
                          segment=segment_bytes(collective, algorithm), local_size=model_local_size(nodes))
    if nodes is not None:           # every rank on one node: every message takes the intra-node link
        return cost.time(machine.alpha, machine.beta, machine.gamma)
    return cost.on(machine)


def evaluate(collective: str, algorithm: str, world: int, nbytes: int, machine: Machine,
             simulate_up_to: int = 256) -> Cell:
    """One cell: a cost-only simulation up to ``simulate_up_to`` ranks, beyond it the closed
    form where it is the clock's (:func:`closed_form`; a ValueError where it is not)."""
    from .simulate import simulate

    # on a hierarchical machine the node-aware algorithms see the machine's own nodes
    nodes = None if machine.flat else tuple(machine.node_of(rank) for rank in range(world))
    if world <= simulate_up_to:
        sim = simulate(builder_of(collective), algorithm, world, numel=max(nbytes // 4, 0),
                       dtype=__import__("torch").float32, data=False, machine=machine, record=False,
                       local_size=nodes)
        seconds, source = sim.stats.time, "simulated"
    else:
        seconds, source = closed_form(collective, algorithm, world, nbytes, machine), "closed form"
    lb = bound_time(collective, world, nbytes, machine)
    return Cell(collective, algorithm, world, nbytes, seconds, seconds / lb if lb else float("nan"), source)


def check_algorithms(collectives: Sequence[str], algorithms: Optional[Sequence[str]]) -> None:
    """ValueError naming the unknown ones and the known ones unless every name of
    ``algorithms`` (None: all) is registered for at least one of ``collectives``."""
    if algorithms is None:
        return
    known = sorted({name for collective in collectives for name in registry.algorithms(collective)})
    unknown = [name for name in algorithms if name not in known]
    if unknown or not algorithms:
        raise ValueError(f"algorithms must name registered algorithms of {', '.join(collectives)}: "
                         f"unknown {', '.join(unknown) or repr(list(algorithms))}; known: {', '.join(known)}")


def _plan(collectives: Sequence[str], worlds: Sequence[int], sizes: Sequence[int],
          algorithms: Optional[Sequence[str]]) -> List[Tuple[str, str, int, int]]:
    """Every (collective, algorithm, world, nbytes) a sweep runs, in its order."""
    plan = []
    for collective in collectives:
        names = [a for a in registry.algorithms(collective) if algorithms is None or a in algorithms]
        for world in worlds:
            # an algorithm registered for one world size (a loaded MSCCL program) runs there only
            runnable = [name for name in names if registry.get(collective, name).world in (None, world)]
            plan += [(collective, name, world, nbytes) for nbytes in sizes for name in runnable]
    return plan


def refusals(collectives: Sequence[str], worlds: Sequence[int], sizes: Sequence[int], machine: Machine,
             algorithms: Optional[Sequence[str]] = None, simulate_up_to: int = 256) -> List[str]:
    """Why each cell above ``simulate_up_to`` whose closed form is not the clock's on
    ``machine`` is refused (:func:`closed_form_refusal`), sorted; [] where the sweep can run."""
    check_algorithms(collectives, algorithms)
    return sorted({refusal for collective, name, world, nbytes in _plan(collectives, worlds, sizes, algorithms)
                   if world > simulate_up_to
                   for refusal in [closed_form_refusal(collective, name, world, nbytes, machine)] if refusal})


def sweep(collectives: Sequence[str], worlds: Sequence[int], sizes: Sequence[int], machine: Machine,
          algorithms: Optional[Sequence[str]] = None, simulate_up_to: int = 256,
          progress=None) -> List[Cell]:
    """Every (collective, world, size, algorithm) cell; ``algorithms`` restricts the names
    (:func:`check_algorithms`). Before anything runs, a ValueError names every cell above
    ``simulate_up_to`` whose closed form is not the clock's on ``machine`` (:func:`refusals`)."""
    refused = refusals(collectives, worlds, sizes, machine, algorithms, simulate_up_to)
    if refused:
        raise ValueError(f"{len(refused)} cell(s) above simulate_up_to={simulate_up_to} have no closed form "
                         f"equal to the clock: " + "; ".join(refused))
    cells = []
    for collective, name, world, nbytes in _plan(collectives, worlds, sizes, algorithms):
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


def ties(cells: Iterable[Cell]) -> Dict[Tuple[str, int, int], List[str]]:
    """Each (collective, world, nbytes) whose best time is shared, within :data:`TIE`, by
    several algorithms: their names, the winner of :func:`best` first."""
    cells = list(cells)
    winners = best(cells)
    out: Dict[Tuple[str, int, int], List[str]] = {}
    for cell in cells:
        key = (cell.collective, cell.world, cell.nbytes)
        top = winners[key]
        if cell is not top and abs(cell.seconds - top.seconds) <= TIE * max(top.seconds, 1e-300):
            out.setdefault(key, [top.algorithm]).append(cell.algorithm)
    return out


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


def crossover_lines(cells: Sequence[Cell]) -> List[str]:
    """:func:`crossovers` as text, each line marking a closed-form cell and a tie, then one
    line per tied cell."""
    cells = list(cells)
    winners, tied = best(cells), ties(cells)
    lines = []
    for collective, world, nbytes, a, b in crossovers(cells):
        key = (collective, world, nbytes)
        marks = ([" (closed form)"] if winners[key].source != "simulated" else []) + \
                ([f" (tie: {' = '.join(tied[key])})"] if key in tied else [])
        lines.append(f"{collective}: p={world}: from {nbytes} B {a} -> {b}{''.join(marks)}")
    for (collective, world, nbytes), names in sorted(tied.items()):
        how = winners[(collective, world, nbytes)].source
        lines.append(f"{collective}: p={world}: at {nbytes} B tie ({how}): {' = '.join(names)}")
    return lines


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
    colour, each cell marked with its time's ratio to the lower bound, ``*`` where the time
    is the closed form's (not simulated) and ``=`` where another algorithm ties."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    winners = {k: v for k, v in best(cells).items() if k[0] == collective}
    tied = ties(cells)
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
            cell = winners[(collective, w, n)]
            mark = ("*" if cell.source != "simulated" else "") + ("=" if (collective, w, n) in tied else "")
            ax.text(j, i, f"{cell.bound_ratio:.2g}{mark}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([_size_label(n) for n in sizes], rotation=45)
    ax.set_yticks(range(len(worlds)))
    ax.set_yticklabels([str(w) for w in worlds])
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("ranks")
    ax.legend(handles=[Patch(color=colours[i], label=name) for i, name in enumerate(names)],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(title or f"{collective}: best algorithm (number: time / lower bound; "
                          f"* closed form, = tie)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
