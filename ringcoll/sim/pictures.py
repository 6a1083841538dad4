"""Pictures of a simulated run: a Chrome-trace / Perfetto JSON and a PNG timeline.

Both draw :attr:`SimStats.timeline` (recorded by default up to 256 ranks, or with
``simulate(..., record=True)``): one row per message (sender, receiver, bytes, start, end)
and per step's local operations (rank, step, start, end, bytes reduced).
"""
from __future__ import annotations

import json
from typing import Dict, List

SEND, RECV, LOCAL = 0, 1, 2
_LANES = {SEND: "send port", RECV: "receive port", LOCAL: "local (reduce/copy)"}


def _timeline(sim):
    timeline = sim.stats.timeline
    if timeline is None:
        raise ValueError("this run kept no timeline: simulate(..., record=True)")
    return timeline


def trace_events(sim) -> List[Dict]:
    """Chrome-trace events (microseconds): per rank (pid) a send, a receive and a local lane
    (tid); one complete event on each end of every message, joined by a flow arrow, and one
    per step's local operations."""
    timeline = _timeline(sim)
    events: List[Dict] = []
    for rank in range(timeline.world):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for tid, name in _LANES.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    for i, (src, dst, nbytes, start, end, src_step, dst_step) in enumerate(timeline.messages):
        ts, dur = start * 1e6, (end - start) * 1e6
        args = {"bytes": nbytes, "src": src, "dst": dst, "src_step": src_step + 1, "dst_step": dst_step + 1}
        events.append({"ph": "X", "name": f"send {nbytes} B to {dst}", "cat": "message", "pid": src,
                       "tid": SEND, "ts": ts, "dur": dur, "args": args})
        events.append({"ph": "X", "name": f"recv {nbytes} B from {src}", "cat": "message", "pid": dst,
                       "tid": RECV, "ts": ts, "dur": dur, "args": args})
        events.append({"ph": "s", "id": i, "name": "message", "cat": "flow", "pid": src, "tid": SEND, "ts": ts})
        events.append({"ph": "f", "bp": "e", "id": i, "name": "message", "cat": "flow", "pid": dst,
                       "tid": RECV, "ts": ts + dur})
    for rank, step, start, end, reduced in timeline.local:
        events.append({"ph": "X", "name": "reduce" if reduced else "copy", "cat": "local", "pid": rank,
                       "tid": LOCAL, "ts": start * 1e6, "dur": max(end - start, 0) * 1e6,
                       "args": {"step": step + 1, "bytes_reduced": reduced}})
    return events


def write_trace(sim, path: str) -> str:
    """Write the run as Chrome-trace JSON (opens in ui.perfetto.dev and chrome://tracing)."""
    doc = {"traceEvents": trace_events(sim), "displayTimeUnit": "ns",
           "otherData": {"collective": sim.collective, "algorithm": sim.algorithm.name,
                         "world": sim.world, "nbytes": sim.nbytes, "machine": sim.machine.to_dict(),
                         "simulated_s": sim.stats.time, "critical_path_steps": sim.stats.steps}}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def plot_timeline(sim, path: str, detail_limit: int = 16) -> str:
    """A PNG timeline: ranks by time, each message an arrow from its sender's row at its start
    to its receiver's row at its end (its bar on the sender's row), reductions in red. Above
    ``detail_limit`` ranks, a summary instead: each rank's send-port busy fraction over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = _timeline(sim)
    world, scale = timeline.world, 1e6
    title = (f"{sim.collective}/{sim.algorithm.name}, p = {world}, {sim.nbytes} B: "
             f"{sim.stats.time * scale:.1f} µs, {sim.stats.steps} steps on the critical path")
    if world <= detail_limit:
        fig, ax = plt.subplots(figsize=(12, 0.45 * world + 1.8))
        for src, dst, nbytes, start, end, _, _ in timeline.messages:
            ax.plot([start * scale, end * scale], [src, src], color="tab:blue", lw=5, alpha=0.35,
                    solid_capstyle="butt")
            ax.annotate("", xy=(end * scale, dst), xytext=(start * scale, src),
                        arrowprops=dict(arrowstyle="->", color="tab:blue", lw=0.7, alpha=0.8))
        for rank, _, start, end, reduced in timeline.local:
            if reduced:
                ax.plot([start * scale, max(end, start) * scale], [rank - 0.18, rank - 0.18],
                        color="tab:red", lw=4, solid_capstyle="butt")
        ax.set_yticks(range(world))
        ax.set_yticklabels([f"rank {r}" for r in range(world)])
        ax.set_ylim(world - 0.5, -0.5)
        ax.plot([], [], color="tab:blue", lw=5, alpha=0.35, label="send port busy, arrow to receiver")
        ax.plot([], [], color="tab:red", lw=4, label="reduction (γ)")
        ax.legend(loc="upper right", fontsize=8)
    else:
        import numpy as np
        bins = 200
        end_time = max(sim.stats.time, 1e-30)
        busy = np.zeros((world, bins))
        width = end_time / bins
        for src, _, _, start, end, _, _ in timeline.messages:
            first, last = int(start / width), min(int(end / width), bins - 1)
            for b in range(first, last + 1):
                lo, hi = max(start, b * width), min(end, (b + 1) * width)
                busy[src, b] += max(hi - lo, 0) / width
        fig, ax = plt.subplots(figsize=(12, 6))
        image = ax.imshow(np.minimum(busy, sim.machine.ports), aspect="auto", cmap="viridis",
                          extent=(0, end_time * scale, world - 0.5, -0.5), interpolation="nearest")
        fig.colorbar(image, ax=ax, label="send ports busy")
        ax.set_ylabel("rank")
    ax.set_xlabel("time (µs)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
