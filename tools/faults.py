"""Fault injection: a rank dies (``os._exit``) or stalls (sleeps past the timeout) at a random
step of a random collective and algorithm; every other rank must raise an error naming a
peer within the timeout plus a small margin, and none may hand back wrong data.

    python -m tools.faults --injections 60 --seed 1 --timeout 3 --out bench/results/faults/faults.json

Each injection runs in a fresh world of 2-4 gloo processes (a world that lost a rank cannot be
reused): every rank warms up with one clean run of the same call, then runs it again while
the victim's executor is hooked to die or stall when it reaches step k of its schedule (k
drawn from the victim's step count; the hook is this script's monkeypatch of the executor's
per-step post, not a production code path). A surviving rank that raised reports its
message and how long the call took; one that completed reports whether its result is exactly
right (a rank whose part finished before the fault, such as a leaf of a broadcast tree, may
legitimately complete); survivors stay alive until every rank has reported, so a peer that
gave up does not look dead. The parent reports the victim's exit code.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue as queue_module
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

#: the drop-ins run (each with data whose exact result is known; its algorithms: registry.collective_of)
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather_single", "reduce_scatter_single",
               "gather", "scatter", "all_to_all_single", "barrier")
KILL_CODE = 17


@dataclass
class Injection:
    id: str
    mode: str               # "kill" or "stall"
    collective: str
    algorithm: str
    world: int
    victim: int
    hook: str               # "post" (before the step's transfers are posted) or "in_flight" (after)
    step_fraction: float    # which step of the victim's schedule: floor(fraction * steps)
    numel: int
    timeout: float
    stall: float


def draw(seed: int, index: int, timeout: float, worlds=(2, 3, 4)) -> Injection:
    import ringcoll
    from ringcoll.schedules.registry import collective_of

    rng = random.Random(f"ringcoll-faults:{seed}:{index}")
    collective = rng.choice(COLLECTIVES)
    world = rng.choice(worlds)
    return Injection(
        id=f"{seed}:{index}", mode=rng.choice(("kill", "stall")), collective=collective,
        algorithm=rng.choice(ringcoll.algorithms(collective_of(collective))), world=world,
        victim=rng.randrange(world), hook=rng.choice(("post", "in_flight")), step_fraction=rng.random(),
        numel=rng.choice((world * 5 + 1, 4099, 70000)), timeout=timeout, stall=timeout + 2)


# -- on each rank ---------------------------------------------------------------------------
def _call(inj: Injection, rank: int):
    """The call and a function telling whether its result is exactly right."""
    import torch

    import ringcoll

    world, n, c, alg = inj.world, inj.numel, inj.collective, inj.algorithm
    x = torch.arange(n, dtype=torch.int64) % 7 + 1 + rank

    def of(r):
        return torch.arange(n, dtype=torch.int64) % 7 + 1 + r

    total = sum(of(r) for r in range(world))
    if c == "all_reduce":
        return (lambda: ringcoll.all_reduce(x, algorithm=alg)), (lambda: torch.equal(x, total))
    if c == "reduce":
        return (lambda: ringcoll.reduce(x, dst=0, algorithm=alg)), (lambda: rank != 0 or torch.equal(x, total))
    if c == "broadcast":
        return (lambda: ringcoll.broadcast(x, src=0, algorithm=alg)), (lambda: torch.equal(x, of(0)))
    if c == "all_gather_single":
        out = torch.zeros(world * n, dtype=torch.int64)
        return (lambda: ringcoll.all_gather_single(out, x, algorithm=alg)), \
            (lambda: torch.equal(out, torch.cat([of(r) for r in range(world)])))
    if c == "reduce_scatter_single":
        big = torch.cat([x * (k + 1) for k in range(world)])
        out = torch.zeros(n, dtype=torch.int64)
        return (lambda: ringcoll.reduce_scatter_single(out, big, algorithm=alg)), \
            (lambda: torch.equal(out, total * (rank + 1)))
    if c == "gather":
        outs = [torch.zeros(n, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
        return (lambda: ringcoll.gather(x, outs, dst=0, algorithm=alg)), \
            (lambda: rank != 0 or all(torch.equal(o, of(r)) for r, o in enumerate(outs)))
    if c == "scatter":
        parts = [of(r) * 10 for r in range(world)] if rank == 0 else None
        out = torch.zeros(n, dtype=torch.int64)
        return (lambda: ringcoll.scatter(out, parts, src=0, algorithm=alg)), \
            (lambda: torch.equal(out, of(rank) * 10))
    if c == "all_to_all_single":
        inp = torch.cat([of(rank) * (k + 1) for k in range(world)])
        out = torch.zeros(world * n, dtype=torch.int64)
        return (lambda: ringcoll.all_to_all_single(out, inp, algorithm=alg)), \
            (lambda: torch.equal(out, torch.cat([of(r) * (rank + 1) for r in range(world)])))
    return (lambda: ringcoll.barrier(algorithm=alg)), (lambda: True)


def _hook(inj: Injection, announce) -> dict:
    """Make this (victim) rank die or stall at step k of its next plan, k drawn from the plan's
    step count the first time the executor posts a step: before posting step k's transfers
    (``hook="post"``), or once they are posted and in flight (``hook="in_flight"``)."""
    from ringcoll.runtime import executor

    original = executor.P2PExecutor._post
    state = {"step": None, "steps": None, "fired": False}

    def fire():
        state["fired"] = True
        announce(state)
        if inj.mode == "kill":
            os._exit(KILL_CODE)
        time.sleep(inj.stall)

    def hooked(self, prepared, index, *rest):
        if state["step"] is None:
            state["steps"] = len(prepared.steps)
            state["step"] = min(int(inj.step_fraction * len(prepared.steps)), len(prepared.steps) - 1)
        due = index == state["step"] and not state["fired"]
        if due and inj.hook == "post":
            fire()
        handle = original(self, prepared, index, *rest)
        if due and inj.hook == "in_flight":
            fire()
        return handle

    executor.P2PExecutor._post = hooked
    return state


def _rank_main(rank: int, inj: Injection, port: int, results, done) -> None:
    try:
        import torch
        import torch.distributed as dist

        import ringcoll

        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, inj.world + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=inj.world,
                                timeout=datetime.timedelta(seconds=120))
        ringcoll.set_timeout(60)
        warm, _ = _call(inj, rank)
        warm()                                  # connections up, schedules cached
        dist.barrier()
        ringcoll.set_timeout(inj.timeout)
        def announce(state):             # the step reaches the parent before the victim dies
            results.put({"rank": rank, "fired": True, "step": state["step"], "steps": state["steps"]})
            if inj.mode == "kill":
                results.close()
                results.join_thread()

        state = _hook(inj, announce) if rank == inj.victim else None
        run, correct = _call(inj, rank)
        start = time.monotonic()
        try:
            run()
        except Exception as error:  # noqa: BLE001 - what is being measured
            outcome = {"raised": True, "error": f"{type(error).__name__}: {error}"[:600]}
        else:
            outcome = {"raised": False, "correct": bool(correct())}
        outcome.update(rank=rank, elapsed=round(time.monotonic() - start, 3),
                       steps=state["steps"] if state else None, step=state["step"] if state else None)
        results.put(outcome)
    except BaseException as error:  # noqa: BLE001 - the harness itself failed
        results.put({"rank": rank, "harness_error": f"{type(error).__name__}: {error}"[:600]})
    done.wait(120)                              # stay alive until every rank has reported
    os._exit(0)


def run_injection(inj: Injection, margin: float) -> dict:
    import torch.distributed as dist

    context = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, inj.world + 1, is_master=True, wait_for_workers=False)
    results, done = context.Queue(), context.Event()
    procs = [context.Process(target=_rank_main, args=(r, inj, store.port, results, done), daemon=True)
             for r in range(inj.world)]
    for proc in procs:
        proc.start()
    expected = inj.world - (1 if inj.mode == "kill" else 0)
    outcomes, fired = {}, {}
    deadline = time.monotonic() + 120 + 3 * inj.stall
    while (len(outcomes) < expected or not fired) and time.monotonic() < deadline:
        if inj.mode == "kill" and procs[inj.victim].exitcode not in (None, KILL_CODE):
            break                               # the victim died before its hook: a harness failure
        try:
            item = results.get(timeout=0.5)
        except queue_module.Empty:
            continue
        if item.get("fired"):
            fired = item
        else:
            outcomes[item["rank"]] = item
            if len(outcomes) == expected:
                # the victim's "fired" may still be queued when the survivors were faster (a kill
                # after its sends were posted: they complete in milliseconds): 2 s more for it
                deadline = min(deadline, time.monotonic() + 2.0)
    done.set()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    victim_code = procs[inj.victim].exitcode
    verdict = judge(inj, outcomes, victim_code, margin)
    verdict["victim_step"], verdict["victim_steps"] = fired.get("step"), fired.get("steps")
    if not fired:
        verdict["problems"].append("the fault never fired (the victim had no step)")
        verdict["ok"] = False
    return verdict


def judge(inj: Injection, outcomes: dict, victim_code: Optional[int], margin: float) -> dict:
    """The verdict on one injection: every survivor raised naming a peer in time, or completed
    with an exactly right result; the dead victim's exit is seen."""
    problems = []
    survivors = [r for r in range(inj.world) if r != inj.victim]
    for rank in survivors:
        out = outcomes.get(rank)
        if out is None:
            problems.append(f"rank {rank} never reported")
        elif "harness_error" in out:
            problems.append(f"rank {rank}: harness error {out['harness_error']}")
        elif out["raised"]:
            if "peer" not in out["error"]:
                problems.append(f"rank {rank}'s error names no peer: {out['error'][:200]}")
            if out["elapsed"] > inj.timeout + margin:
                problems.append(f"rank {rank} raised after {out['elapsed']:.1f} s > timeout {inj.timeout} + {margin}")
        elif not out["correct"]:
            problems.append(f"rank {rank} completed with WRONG data")
    victim = outcomes.get(inj.victim)
    if inj.mode == "kill" and victim_code != KILL_CODE:
        problems.append(f"the victim's exit code is {victim_code}, not {KILL_CODE}")
    if inj.mode == "stall" and victim is not None and not victim.get("raised", True) and not victim.get("correct"):
        problems.append("the stalled victim completed with WRONG data")
    raised = [r for r in survivors if outcomes.get(r, {}).get("raised")]
    return {"injection": asdict(inj), "ok": not problems, "problems": problems,
            "survivors_raised": len(raised),
            "survivors_completed_correct": sum(1 for r in survivors if outcomes.get(r, {}).get("correct")),
            "max_elapsed": max([outcomes[r]["elapsed"] for r in raised] or [0.0]),
            "victim_exit_code": victim_code,
            "outcomes": [outcomes.get(r) for r in range(inj.world)]}


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--injections", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3.0, help="ringcoll's timeout in the ranks (s)")
    parser.add_argument("--margin", type=float, default=2.0, help="allowed beyond the timeout (s)")
    parser.add_argument("--worlds", default="2,3,4")
    parser.add_argument("--replay", metavar="SEED:INDEX")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    worlds = tuple(int(w) for w in args.worlds.split(","))
    if args.replay:
        seed, index = (int(p) for p in args.replay.split(":"))
        plan = [draw(seed, index, args.timeout, worlds)]
    else:
        plan = [draw(args.seed, i, args.timeout, worlds) for i in range(args.injections)]
    load_before, start = _load(), time.monotonic()
    verdicts = []
    for number, inj in enumerate(plan, 1):
        verdict = run_injection(inj, args.margin)
        verdicts.append(verdict)
        print(f"[{number}/{len(plan)}] {inj.id} {inj.mode} rank {inj.victim} of {inj.world} at step "
              f"{verdict['victim_step']}/{verdict['victim_steps']} ({inj.hook}) of {inj.collective}/{inj.algorithm}: "
              f"{'ok' if verdict['ok'] else 'FAIL ' + '; '.join(verdict['problems'])} "
              f"(survivors raised {verdict['survivors_raised']}, completed {verdict['survivors_completed_correct']}, "
              f"max {verdict['max_elapsed']:.2f} s)", flush=True)
    failing = [v for v in verdicts if not v["ok"]]
    summary = {
        "command": "python -m tools.faults " + " ".join(argv if argv is not None else sys.argv[1:]),
        "injections": len(verdicts), "failing": len(failing), "timeout_s": args.timeout, "margin_s": args.margin,
        "kills": sum(v["injection"]["mode"] == "kill" for v in verdicts),
        "stalls": sum(v["injection"]["mode"] == "stall" for v in verdicts),
        "survivors": sum(v["injection"]["world"] - 1 for v in verdicts),
        "survivors_raised": sum(v["survivors_raised"] for v in verdicts),
        "survivors_completed_correct": sum(v["survivors_completed_correct"] for v in verdicts),
        "max_elapsed_s": max([v["max_elapsed"] for v in verdicts] or [0.0]),
        "seconds": round(time.monotonic() - start, 1), "load_before": load_before, "load_after": _load(),
        "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "verdicts": verdicts,
    }
    print(f"{len(verdicts)} injections, {len(failing)} failing; survivors: {summary['survivors_raised']} raised, "
          f"{summary['survivors_completed_correct']} completed correctly, of {summary['survivors']}; slowest error "
          f"{summary['max_elapsed_s']:.2f} s (timeout {args.timeout} s)")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
