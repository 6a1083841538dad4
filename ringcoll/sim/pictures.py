"""Pictures of a simulated run: a Chrome-trace / Perfetto JSON and a PNG timeline.

Both draw :attr:`SimStats.timeline` (recorded by default up to 256 ranks, or with
``simulate(..., record=True)``): one row per message (sender, receiver, bytes, start, end)
and per step's local operations (rank, step, start, end, bytes reduced). On a machine with
links (a network, a 2-level machine's NICs) the trace also has a process of link lanes: one
track per busy link (per lane of a link of several), an event for each message's hold of it.
"""
from __future__ import annotations

import json
import math
from typing import Dict, List

SEND, RECV, LOCAL = 0, 1, 2
_LANES = {SEND: "send port", RECV: "receive port", LOCAL: "local (reduce/copy)"}


def _lane(base: int, port: int) -> int:
    """The trace lane (tid) of send or receive port ``port``: ports 0 keep lanes 0 and 1,
    port k > 0 gets 2k + 1 (send) and 2k + 2 (receive), after the local lane (2)."""
    return base if port == 0 else 2 * port + 1 + base


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
    ports = getattr(sim.machine, "ports", 1)
    events: List[Dict] = []
    for rank in range(timeline.world):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for tid, name in _LANES.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": name + (" 0" if ports > 1 and tid != LOCAL else "")}})
        for port in range(1, ports):
            for base, name in ((SEND, "send port"), (RECV, "receive port")):
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": _lane(base, port),
                               "args": {"name": f"{name} {port}"}})
    used = timeline.ports or [(0, 0)] * len(timeline.messages)
    for i, ((src, dst, nbytes, start, end, src_step, dst_step), (out, into)) in \
            enumerate(zip(timeline.messages, used)):
        ts, dur = start * 1e6, (end - start) * 1e6
        args = {"bytes": nbytes, "src": src, "dst": dst, "src_step": src_step + 1, "dst_step": dst_step + 1}
        send_tid, recv_tid = _lane(SEND, out), _lane(RECV, into)
        events.append({"ph": "X", "name": f"send {nbytes} B to {dst}", "cat": "message", "pid": src,
                       "tid": send_tid, "ts": ts, "dur": dur, "args": args})
        events.append({"ph": "X", "name": f"recv {nbytes} B from {src}", "cat": "message", "pid": dst,
                       "tid": recv_tid, "ts": ts, "dur": dur, "args": args})
        events.append({"ph": "s", "id": i, "name": "message", "cat": "flow", "pid": src, "tid": send_tid, "ts": ts})
        events.append({"ph": "f", "bp": "e", "id": i, "name": "message", "cat": "flow", "pid": dst,
                       "tid": recv_tid, "ts": ts + dur})
    for rank, step, start, end, reduced in timeline.local:
        events.append({"ph": "X", "name": "reduce" if reduced else "copy", "cat": "local", "pid": rank,
                       "tid": LOCAL, "ts": start * 1e6, "dur": max(end - start, 0) * 1e6,
                       "args": {"step": step + 1, "bytes_reduced": reduced}})
    return events + link_events(sim, pid=timeline.world)


def link_name(net, link_id: int) -> str:
    """A link by its ends and level: ``host 3 (3, 0) → host 4 (4, 0) (x)``, ``switch 8 →
    switch 12 (up1)`` (a node past the hosts is a switch, router or NIC side, by its id)."""
    link = net.links[link_id]

    def node(n: int) -> str:
        if n >= net.hosts:
            return f"switch {n}"
        return f"host {n} {net.coords(n)}" if net.kind in ("torus", "mesh") else f"host {n}"
    return f"{node(link.src)} → {node(link.dst)}" + (f" ({link.level})" if link.level else "")


def link_holds(sim) -> List[tuple]:
    """Each message's hold of each link of its route, as the clock books it: ``(link id,
    start, end, message index)``; from the message's start for its wire time n·β_path on a
    wire-held link, for its whole time on a message-held one (``Link.hold``). Empty without a
    network."""
    stats = sim.stats.network
    if stats is None:
        return []
    net, machine, timeline = stats.network, sim.machine, _timeline(sim)
    host = net.hosts_of(timeline.world)
    holds = []
    for i, (src, dst, nbytes, start, end, _, _) in enumerate(timeline.messages):
        path = net.route(host[src], host[dst])
        if not path:
            continue
        wire = nbytes * net.price(path, machine.alpha, machine.beta)[1]
        for link_id in path:
            held = end - start if net.links[link_id].hold == "message" else wire
            if held > 0:
                holds.append((link_id, start, start + held, i))
    return holds


def link_events(sim, pid: int) -> List[Dict]:
    """The link lanes of the trace (process ``pid``): a track per busy link (per lane used,
    where a link has several), one complete event per message's hold of it (:func:`link_holds`)."""
    holds = sorted(link_holds(sim), key=lambda h: (h[0], h[1], h[3]))
    if not holds:
        return []
    net, timeline = sim.stats.network.network, sim.stats.timeline
    events: List[Dict] = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network links"}}]
    tracks: Dict[tuple, int] = {}
    ends: Dict[int, List[float]] = {}
    for link_id, start, end, i in holds:
        lanes = ends.setdefault(link_id, [])
        lane = next((k for k, free in enumerate(lanes) if free <= start * (1 + 1e-12)), len(lanes))
        lanes[lane:lane + 1] = [end]
        if (link_id, lane) not in tracks:
            tracks[link_id, lane] = tid = len(tracks)
            link = net.links[link_id]
            name = link_name(net, link_id) + (f" lane {lane}" if link.lanes > 1 else "")
            events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
                       {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
        src, dst, nbytes = timeline.messages[i][:3]
        events.append({"ph": "X", "name": f"{nbytes} B {src} → {dst}", "cat": "link", "pid": pid,
                       "tid": tracks[link_id, lane], "ts": start * 1e6, "dur": (end - start) * 1e6,
                       "args": {"link": link_name(net, link_id), "level": net.links[link_id].level,
                                "bytes": nbytes, "src": src, "dst": dst, "message": i}})
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
        for src, dst, _nbytes, start, end, _, _ in timeline.messages:
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


def _layout(net):
    """Where to draw each node of a network: a 1-D torus or mesh on a circle or a line, a
    grid's first two dimensions, a fat-tree by level (hosts at the bottom), a dragonfly's
    groups on a circle with their routers around each, any other graph on a circle."""
    import math

    kind = net.kind
    if kind in ("torus", "mesh") and len(net.params["dims"]) == 1 and kind == "torus":
        k = net.params["dims"][0]
        return {h: (math.cos(2 * math.pi * h / k), math.sin(2 * math.pi * h / k)) for h in range(k)}
    if kind in ("torus", "mesh", "fat_tree", "nodes"):
        return dict(net.position)
    nodes = sorted({link.src for link in net.links} | {link.dst for link in net.links})
    if kind == "dragonfly":
        p = net.params
        groups, routers, per = p["groups"], p["routers"], p["hosts"]
        pos = {}
        for node in nodes:
            if node >= net.hosts:
                g, a = divmod(node - net.hosts, routers)
                radius = 1.0
            else:
                g, rest = divmod(node, routers * per)
                a = rest // per + (rest % per - (per - 1) / 2) * 0.6 / per
                radius = 1.35
            centre = 2 * math.pi * g / groups
            angle = centre + (a - (routers - 1) / 2) * (2 * math.pi / groups) * 0.8 / max(routers, 1)
            pos[node] = (radius * math.cos(angle), radius * math.sin(angle))
        return pos
    return {n: (math.cos(2 * math.pi * i / len(nodes)), math.sin(2 * math.pi * i / len(nodes)))
            for i, n in enumerate(nodes)}


def plot_links(sim, path: str) -> str:
    """A PNG of the bytes each link of the machine's network carried (``sim.stats.network``):
    every directed link a line from its source towards its destination, offset to its own
    side so both directions show, coloured by bytes; a torus as a grid (wrap-around links as
    stubs leaving the grid; a ring as a circle), a fat-tree by level, a dragonfly's groups
    around a circle."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    stats = sim.stats.network
    if stats is None:
        raise ValueError("plot_links needs a run on a machine with a network (Machine.torus, .fat_tree, ...)")
    net = stats.network
    pos = _layout(net)
    segments, loads = [], []
    for link, nbytes in zip(net.links, stats.link_bytes):
        (x0, y0), (x1, y1) = pos[link.src], pos[link.dst]
        dx, dy = x1 - x0, y1 - y0
        if net.kind == "torus" and len(net.params["dims"]) > 1 and (abs(dx) > 1.5 or abs(dy) > 1.5):
            # a wrap-around link: a stub leaving the grid the way the message travels
            dx = -0.45 if dx > 0 else 0.45 if dx < 0 else 0.0
            dy = -0.45 if dy > 0 else 0.45 if dy < 0 else 0.0
            x1, y1 = x0 + dx, y0 + dy
        norm = math.hypot(dx, dy) or 1.0
        off = 0.06 if net.kind in ("torus", "mesh") and len(net.params["dims"]) > 1 else 0.012
        ox, oy = -dy / norm * off, dx / norm * off
        segments.append([(x0 + ox, y0 + oy), (x1 + ox, y1 + oy)])
        loads.append(nbytes)
    by_level = net.kind in ("fat_tree", "nodes")
    fig, ax = plt.subplots(figsize=(12, 5) if by_level else (9, 8))
    most = max(loads, default=0) or 1
    lines = LineCollection(segments, cmap="viridis", linewidths=[0.6 + 2.4 * b / most for b in loads])
    lines.set_array([b / 2 ** 20 for b in loads])
    lines.set_clim(0, most / 2 ** 20)
    ax.add_collection(lines)
    fig.colorbar(lines, ax=ax, label="MiB carried")
    hosts = [pos[h] for h in range(net.hosts) if h in pos]
    ax.scatter([x for x, _ in hosts], [y for _, y in hosts], s=8, color="black", zorder=3)
    others = [xy for node, xy in pos.items() if node >= net.hosts]
    if others:
        ax.scatter([x for x, _ in others], [y for _, y in others], s=30, marker="s", color="tab:gray", zorder=3)
    ax.autoscale()
    ax.set_aspect("auto" if by_level else "equal")
    top = stats.bottlenecks(1)
    title = (f"{sim.collective}/{sim.algorithm.name}, p = {sim.world}, {sim.nbytes} B\n{net.describe()}\n"
             f"{sim.stats.time * 1e6:.1f} µs; link bytes max {stats.max_link_bytes / 2 ** 20:.3g} MiB, "
             f"mean {stats.mean_link_bytes / 2 ** 20:.3g} MiB"
             + (f"; busiest {top[0][1]}→{top[0][2]} ({top[0][3]})" if top else ""))
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
