"""Perfetto traces on machines with links: a process of link lanes, one track per busy link,
an event for each message's hold of each link of its route, at the times the clock booked it
(the events of a link add up to the clock's per-link busy time and bytes, and never overlap on
a lane)."""
from __future__ import annotations

import collections
import json

import pytest

import ringcoll
from ringcoll.sim.pictures import link_name
from _util import one_thread  # noqa: F401 - the simulator runs on one thread

CASES = {
    # a torus with ranks shuffled: multi-hop routes, messages sharing links and waiting for them
    "torus": (ringcoll.Machine.torus((4, 4), placement=("random", 3)), "ring", 16),
    # a 4:1 tapered fat-tree: up-links shared by the leaves' hosts
    "fat_tree": (ringcoll.Machine.fat_tree(4, levels=2, oversubscription=4.0), "rabenseifner", 8),
}


def _trace(tmp_path, machine, algorithm, world):
    sim = ringcoll.simulate("all_reduce", algorithm, world, numel=4096, machine=machine)
    with open(sim.trace(str(tmp_path / "t.json"))) as f:
        return sim, json.load(f)["traceEvents"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_link_lanes_hold_every_message_on_every_link_as_the_clock_booked_it(tmp_path, case):
    machine, algorithm, world = CASES[case]
    sim, events = _trace(tmp_path, machine, algorithm, world)
    net, stats = sim.stats.network.network, sim.stats.network
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes[world] == "network links"
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["pid"] == world and e["name"] == "thread_name"}
    holds = [e for e in events if e.get("cat") == "link"]
    ids = {link_name(net, i): i for i in range(len(net.links))}
    busy, carried, by_track = collections.Counter(), collections.Counter(), collections.defaultdict(list)
    for e in holds:
        assert e["pid"] == world and e["args"]["link"] in tracks[e["tid"]]
        link_id = ids[e["args"]["link"]]
        busy[link_id] += e["dur"] * 1e-6
        carried[link_id] += e["args"]["bytes"]
        by_track[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    used = [i for i, b in enumerate(stats.link_busy) if b > 0]
    assert sorted(busy) == used and len(tracks) >= len(used) > 0
    for i in used:
        assert busy[i] == pytest.approx(stats.link_busy[i], rel=1e-9)
        assert carried[i] == stats.link_bytes[i]
    for spans in by_track.values():                                     # a lane holds one message at a time
        spans.sort()
        assert all(a[1] <= b[0] * (1 + 1e-9) + 1e-12 for a, b in zip(spans, spans[1:]))
    # every message with a route has an event on each of its links, named by the link's ends and level
    hosts = net.hosts_of(world)
    messages = sim.stats.timeline.messages
    per_message = collections.Counter(e["args"]["message"] for e in holds)
    for i, (src, dst, *_rest) in enumerate(messages):
        assert per_message[i] == len(net.route(hosts[src], hosts[dst]))
    # the case is not trivial: routes of several links, links shared by several messages
    assert max(per_message.values()) > 1 and max(collections.Counter(e["tid"] for e in holds).values()) > 1


def test_link_names_say_level_and_ends(tmp_path):
    sim, events = _trace(tmp_path, *CASES["fat_tree"])
    names = {e["args"]["name"] for e in events if e["pid"] == 8 and e["name"] == "thread_name"}
    assert {"host 0 → switch 8 (host)", "switch 8 → switch 12 (up1)"} <= names
    levels = {e["args"]["level"] for e in events if e.get("cat") == "link"}
    assert len(levels) >= 2                                    # host links and the tapered ones above
    sim, events = _trace(tmp_path, ringcoll.Machine.torus((4, 4)), "ring", 16)
    names = {e["args"]["name"] for e in events if e["pid"] == 16 and e["name"] == "thread_name"}
    assert "host 0 (0, 0) → host 1 (1, 0) (x)" in names


def test_a_flat_machine_has_no_link_lanes(tmp_path):
    _, events = _trace(tmp_path, ringcoll.Machine(), "ring", 4)
    assert not [e for e in events if e.get("cat") == "link" or e.get("pid") == 4]
