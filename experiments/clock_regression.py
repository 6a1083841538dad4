"""The clock's regression record: every statistic of a broad set of runs, bit for bit, to
compare before and after a change to the simulator's clock (ringcoll.sim.clock, its compiled
twin ringcoll.sim._batch_clock, or the machine model):

    python -m experiments.clock_regression record before.json     # on the old tree
    python -m experiments.clock_regression record after.json      # on the new one
    python -m experiments.clock_regression compare before.json after.json

Runs (about 7,400, a minute of CPU): every registered collective x algorithm at p = 2, 3, 4,
5, 8, 16 with data (two sizes, timelines and critical paths up to p = 8) and without, on flat
(1 and 2 ports, α = 0), 2-level (NICs of 1 and 2 ports), torus, fat-tree and dragonfly
machines; cost-only runs at p = 64 with and without symmetry (mirrored runs, the compiled
one-step clock); and hand-made schedules through ``run_schedules``: deadlocks, a size
mismatch, a bad peer, messages held in a circle, and random exchanges. Floats are written as
``float.hex``; an error is recorded as its text (the deadlock report's included)."""
from __future__ import annotations

import json
import random
import sys
import time

from ringcoll.schedules.registry import algorithms
from ringcoll.schedules.vocabulary import Buf, Recv, Reduce, Send, Step
from ringcoll.sim.clock import ScheduleError, run_schedules
from ringcoll.cost.machine import Machine
from ringcoll.sim.simulate import simulate


def exact(x):
    """A float as its hex text (bit for bit), anything else as it is."""
    return float(x).hex() if isinstance(x, float) else x


def stats_dump(st):
    """Every statistic of a run: per rank, per link, the timeline and its critical path, the network's."""
    out = {"time": exact(st.time),
           "ranks": [[r.steps, r.messages, r.bytes_sent, r.bytes_received, r.bytes_reduced, exact(r.time)]
                     for r in st.ranks],
           "critical": st.critical_path, "links": sorted(st.link_bytes.items()) if st.link_bytes is not None else None,
           "mirrored": st.mirrored, "crossing": st.crossing, "compiled": st.compiled}
    if st.timeline is not None:
        tl = st.timeline
        out["msgs"] = [[a, b, n, exact(s), exact(e), i, j] for a, b, n, s, e, i, j in tl.messages]
        out["local"] = [[a, b, exact(s), exact(e), n] for a, b, s, e, n in tl.local]
        out["ports"] = tl.ports
        out["cpath"] = [[exact(x) if isinstance(x, float) else x for x in row] for row in tl.critical_path()]
    if st.network is not None:
        ns = st.network
        out["net"] = [ns.hosts, ns.link_bytes, [exact(x) for x in ns.link_busy], ns.hop_bytes]
    return out


def machines():
    """The machines of the per-algorithm runs."""
    yield "flat", Machine()
    yield "flat_p2", Machine(ports=2)
    yield "flat_a0", Machine(alpha=0.0)
    yield "hier4", Machine.hierarchical(4, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9))
    yield "hier2_nic2", Machine.hierarchical(2, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9), nic_ports=2, ports=2)
    yield "torus4x4", Machine.torus((4, 4), alpha=2e-6, beta=1 / 25e9)
    yield "torus4x4p2", Machine.torus((4, 4), alpha=2e-6, beta=1 / 25e9, ports=2)
    yield "fat4", Machine.fat_tree(4, oversubscription=2.0)
    yield "dfly", Machine.dragonfly(3, 2, 2, 1)


def main(path: str) -> None:
    """Record every run's statistics (or error) to the JSON file ``path``."""
    res = {}
    t0 = time.time()
    worlds = [2, 3, 4, 5, 8, 16]
    for mname, m in machines():
        for coll, names in algorithms().items():
            for alg in names:
                for world in worlds:
                    if m.network is not None and world > 16:
                        continue
                    for numel, data in ((1000, True), (37, True), (4096, False)):
                        if not data and world < 4:
                            continue
                        key = f"{mname}|{coll}|{alg}|{world}|{numel}|{data}"
                        try:
                            kw = {}
                            if alg in ("hierarchical",):
                                kw["local_size"] = 2 if world % 2 == 0 else None
                            sim = simulate(coll, alg, world=world, numel=numel, machine=m, data=data,
                                           record=data and world <= 8, **{k: v for k, v in kw.items() if v is not None})
                            res[key] = stats_dump(sim.stats)
                        except Exception as e:  # noqa: BLE001 - any error is a recorded outcome, compared run to run
                            res[key] = f"{type(e).__name__}: {e}"
    # larger cost-only worlds: mirrored runs and the compiled one-step clock
    for mname, m in [("flat", Machine()),
                     ("hier8", Machine.hierarchical(8, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9))),
                     ("torus8x8", Machine.torus((8, 8), alpha=2e-6, beta=1 / 25e9)),
                     ("torus8x8p4", Machine.torus((8, 8), alpha=2e-6, beta=1 / 25e9, ports=4)),
                     ("fat8", Machine.fat_tree(8))]:
        for coll, alg in [("all_reduce", "ring"), ("all_reduce", "rabenseifner"), ("all_reduce", "swing_bandwidth"),
                          ("all_reduce", "swing_torus_bandwidth"), ("all_reduce", "bucket_torus"),
                          ("all_reduce", "torus2d"), ("all_to_all", "pairwise"), ("all_to_all", "linear"),
                          ("all_gather", "bruck"), ("barrier", "dissemination"),
                          ("all_reduce", "bine"), ("all_reduce", "double_binary_tree"), ("reduce_scatter", "pat"),
                          ("all_reduce", "hierarchical"), ("all_gather", "direct"), ("broadcast", "pipelined_chain")]:
            for sym in (True, False):
                key = f"big|{mname}|{coll}|{alg}|64|{sym}"
                try:
                    kw = {"local_size": 8} if alg == "hierarchical" else {}
                    sim = simulate(coll, alg, world=64, numel=1 << 16, machine=m, data=False, record=False,
                                   symmetry=sym, **kw)
                    res[key] = stats_dump(sim.stats)
                except Exception as e:  # noqa: BLE001 - any error is a recorded outcome, compared run to run
                    res[key] = f"{type(e).__name__}: {e}"
    # error reports: deadlock, size mismatch, bad peer, circular order
    res["errors"] = schedules_run(stats_dump)
    json.dump(res, open(path, "w"), sort_keys=True)
    print(len(res), "cases", round(time.time() - t0, 1), "s", file=sys.stderr)


def buf(n, s=0, name="data"):
    """``n`` elements of ``name`` from ``s``."""
    return Buf(name, s, s + n)


def cases():
    """Hand-made schedules (name, each rank's steps): errors, held messages, random exchanges."""
    S = Step
    yield "deadlock_recv", [[S((Recv(1, buf(4)),))], [S((Recv(0, buf(4)),))]]
    yield "deadlock_send", [[S((Send(1, buf(4)),))], [S(())]]
    yield "mismatch", [[S((Send(1, buf(4)),))], [S((Recv(0, buf(5)),))]]
    yield "badpeer", [[S((Send(0, buf(4)),))], [S(())]]
    yield "deadlock_many", [[S((Recv((r + 1) % 20, buf(4)), Send((r + 2) % 20, buf(3))))] for r in range(20)]
    # circular order: rank 0 posts send to 1 then recv from 1; rank 1 posts send to 0 first, both ok;
    # crossed order forcing holds
    yield "crossed", [[S((Send(1, buf(4)), Send(2, buf(4)), Recv(2, buf(4, 8)), Recv(1, buf(4, 8))))],
                      [S((Recv(0, buf(4)), Send(2, buf(4)), Send(0, buf(4)), Recv(2, buf(4, 8))))],
                      [S((Recv(1, buf(4)), Send(0, buf(4)), Recv(0, buf(4, 8)), Send(1, buf(4))))]]
    yield "circle", [[S((Send(1, buf(4)), Recv(1, buf(4, 8))))], [S((Send(0, buf(4)), Recv(0, buf(4, 8))))]]
    # a circle of waiting order: rank0 sends to 1 then 2; rank 1 recv from 2 then 0; rank2 ...
    yield "order_circle", [[S((Send(1, buf(1)), Recv(2, buf(1, 1))))],
                           [S((Recv(2, buf(1)), Recv(0, buf(1, 1)), Send(2, buf(1, 2))))],
                           [S((Recv(1, buf(1)), Send(1, buf(1, 1)), Send(0, buf(1, 2))))]]
    rnd = random.Random(5)
    for k in range(30):
        world = rnd.randint(2, 7)
        scheds = [[] for _ in range(world)]
        for _stepno in range(rnd.randint(1, 4)):
            msgs = [(a, b, rnd.randint(1, 5000)) for a in range(world) for b in range(world)
                    if a != b and rnd.random() < 0.4]
            per = [[] for _ in range(world)]
            for a, b, n in msgs:
                per[a].append(Send(b, buf(n)))
                per[b].append(Recv(a, buf(n, 0, "r")))
            for r in range(world):
                rnd.shuffle(per[r])
                loc = (Reduce(buf(rnd.randint(1, 100)), (buf(3, 0, "r"),)),) if rnd.random() < 0.5 else ()
                scheds[r].append(S(tuple(per[r]), loc))
        yield f"random{k}", scheds


def schedules_run(dump):
    """Each hand-made schedule on six machines: its statistics or its error's text."""
    out = {}
    ms = [("flat", Machine()), ("p2", Machine(ports=2)), ("a0", Machine(alpha=0.0)),
          ("hier", Machine.hierarchical(2, intra=(1e-6, 1 / 200e9), inter=(5e-6, 1 / 20e9))),
          ("torus", Machine.torus((2, 4), alpha=2e-6, beta=1 / 25e9)),
          ("fat", Machine.fat_tree(4, oversubscription=2.0, ports=2))]
    for name, sched in cases():
        for mname, m in ms:
            if m.network is not None and len(sched) > 8:
                continue
            try:
                out[f"{name}|{mname}"] = dump(run_schedules([list(s) for s in sched], m, [4] * len(sched), record=True,
                                                            describe=[f"t{name}"] * len(sched)))
            except ScheduleError as e:
                out[f"{name}|{mname}"] = f"ScheduleError: {e}"
    return out


def compare(before: str, after: str) -> int:
    """Print the first differences between two records; the number of differences."""
    a, b = json.load(open(before)), json.load(open(after))
    bad = []

    def walk(x, y, path):
        if x == y:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), path + [k])
        else:
            bad.append(path)
            if len(bad) <= 10:
                print("DIFF", "/".join(map(str, path)), str(x)[:200], "|", str(y)[:200])
    walk(a, b, [])
    print(f"differences: {len(bad)} of {len(a)} cases + {len(a.get('errors', {}))} hand-made schedules")
    return len(bad)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        main(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
    else:
        sys.exit(__doc__)
