"""The clock of a one-step exchange on a torus, compiled: every rank's messages at once.

A schedule of one step per rank (the ``direct`` algorithms, the linear all-to-all) posts all
its messages at time 0, and the event clock (:class:`ringcoll.sim.clock.Clock`) books
them in one batch at that time: in posting order, (send position, receive position, sender),
each message held back until it heads both its sender's sends and its receiver's receives not
yet booked. On a torus such messages share links with their own translates, so a mirrored
run (the representatives' alone) cannot stand for every rank: by-rank arbitration is not
translation invariant. Every rank must run: at 4,096 ranks, 16.8 million messages of about
32 links each, a quarter of an hour of Python. This module runs that same clock in a
numba-compiled loop over arrays (:mod:`ringcoll.sim._batch_clock`): rank r's messages are
its representative's (r mod L) with the peers and the route's links moved by r - r mod L, so
only the L representatives' steps are ever built as objects. ``run_plans`` hands it every
cost-only run of a rotation-symmetric one-step schedule on a torus placed linearly (the
direct all-reduce of 1 MiB on a 64x64 torus: about 50 s on one core,
bench/results/study/topology_scale_64x64.txt).

It is the event clock's arithmetic in the same order (earliest-gap booking on every port and
link lane, the same merges of touching intervals, the same sums), so its statistics are
equal to the event clock's, float for float: tests/sim/test_batch.py compares every field on
tori of several shapes, port counts and sizes. It declines (returns None, and the event clock
runs) whatever it does not cover: more than one step, a message not matched, a size
mismatch, messages waiting on each other in a circle, a timeline, a LogGP machine (o, g, L:
the event clock's :meth:`~ringcoll.sim.clock.Clock.take_loggp`). A window
(``Machine.window``) changes nothing here: one step has no later step to post early.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence

import numpy as np

from ..cost.machine import Machine
from ..schedules.vocabulary import Recv, Send

__all__ = ["OneStep", "one_step_clock", "one_step_torus"]


def one_step_torus(machine: Machine, count: int, world: int):
    """The torus :func:`run_one_step` runs ``world`` ranks on from ``count`` representatives,
    or None where it does not: another network, another placement, shifts by ``count``
    that do not map the torus onto itself, a LogGP machine."""
    net = machine.network_for(world)
    if machine.is_loggp or net is None or net.kind != "torus" or count >= world \
            or net.mirror_period(count, world) != count:
        return None
    return net if all(link.hold == "wire" for link in net.links) else None


class OneStep(NamedTuple):
    """What :func:`one_step_clock` finds: per rank its end, messages sent, bytes sent and
    received; bytes per representative link ``rep * world + peer``; per network link its
    bytes and busy seconds; hop-bytes; the network."""

    times: List[float]
    messages: List[int]
    sent: List[int]
    received: List[int]
    per_link: Dict[int, int]
    link_bytes: List[int]
    link_busy: List[float]
    hop_bytes: int
    network: object


def one_step_clock(representatives: Sequence, machine: Machine, itemsize: int, world: int,
                   reduced: Sequence[int]):
    """The clock of a cost-only run of ``world`` ranks, rank r running representative ``r %
    L``'s schedule (``representatives``: L lists of steps, ``reduced[a]`` bytes reduced by
    representative a's) with every peer q moved to ``(q + r - r % L) % world``, on
    ``machine``'s torus (placed linearly, L a multiple of its last dimension's stride): a
    :class:`OneStep`, or None where the event clock must run
    (:func:`ringcoll.sim.engine.run_one_step` makes it the event clock's statistics)."""
    count = len(representatives)
    net = one_step_torus(machine, count, world)
    if net is None or any(len(steps) != 1 for steps in representatives):
        return None
    # the representatives' transfers: per representative, its sends (position, peer, elements)
    # and its receives by (peer, occurrence)
    send_rep, send_pos, send_peer, send_numel, send_recv_pos, send_index = [], [], [], [], [], []
    recv_count, send_count = [], []
    receives: List[Dict] = []
    for rep, (st,) in enumerate(representatives):
        table, seen = {}, {}
        for pos, item in enumerate(st.comms):
            peer = item.peer
            if type(item) not in (Send, Recv) or not 0 <= peer < world or peer == rep:
                return None
            if type(item) is Recv:
                occurrence = seen.get(peer, 0)
                seen[peer] = occurrence + 1
                table[(peer, occurrence)] = (pos, item.buf.stop - item.buf.start, len(table))
        receives.append(table)
        recv_count.append(len(table))
    for rep, (st,) in enumerate(representatives):
        seen, index = {}, 0
        for pos, item in enumerate(st.comms):
            if type(item) is not Send:
                continue
            peer = item.peer
            occurrence = seen.get(peer, 0)
            seen[peer] = occurrence + 1
            # rank rep + kL's send to (peer + kL) meets that rank's receive from rep + kL:
            # representative peer % L's receive from (rep - peer + peer % L)
            other = peer % count
            found = receives[other].get(((rep - peer + other) % world, occurrence))
            numel = item.buf.stop - item.buf.start
            if found is None or found[1] != numel:
                return None
            send_rep.append(rep)
            send_pos.append(pos)
            send_peer.append(peer)
            send_numel.append(numel)
            send_recv_pos.append((found[0], found[2]))
            send_index.append(index)
            index += 1
        send_count.append(index)
    if sum(send_count) != sum(recv_count):
        return None                         # a receive no send meets: the event clock names it

    alpha, beta, gamma, ports = machine.alpha, machine.beta, machine.gamma, machine.ports
    links = net.links
    link_host, link_kind, host_link = link_kinds(net)
    # the representatives' routes and prices, as the event clock routes and prices them
    path_ptr, path_links = _routes(net, np.array(send_rep, dtype=np.int64), np.array(send_peer, dtype=np.int64),
                                   link_host, link_kind, host_link)
    lengths = np.diff(path_ptr).tolist()
    if len({(link.latency, link.beta) for link in links}) == 1:
        # links alike: a route's price is its length's (the same sum of the same terms)
        prices = {}
        for k, n in enumerate(lengths):
            if n not in prices:
                prices[n] = net.price(path_links[path_ptr[k]:path_ptr[k + 1]].tolist(), alpha, beta)
        priced = [prices[n] for n in lengths]
    else:
        priced = [net.price(path_links[path_ptr[k]:path_ptr[k + 1]].tolist(), alpha, beta)
                  for k in range(len(lengths))]
    path_alpha = np.array([a for a, _ in priced], dtype=np.float64)
    path_beta = np.array([b for _, b in priced], dtype=np.float64)
    lanes = np.array([link.lanes for link in links], dtype=np.int64)

    from ._batch_clock import run as clock      # numba, compiled on first use and cached on disk
    out = clock(
        world, count, ports, float(alpha), float(gamma), itemsize,
        np.array(send_count, dtype=np.int64), np.array(recv_count, dtype=np.int64),
        np.array(send_pos, dtype=np.int64), np.array(send_peer, dtype=np.int64),
        np.array(send_numel, dtype=np.int64),
        np.array([p for p, _ in send_recv_pos], dtype=np.int64),
        np.array([i for _, i in send_recv_pos], dtype=np.int64),
        np.array(send_index, dtype=np.int64),
        path_ptr, path_links, path_alpha, path_beta,
        link_host, link_kind, host_link, lanes, np.array(reduced, dtype=np.int64))
    status, times, messages, sent, received, net_bytes, net_busy, hop_bytes = out
    if status != 0:
        return None                         # messages waiting on each other in a circle
    per_link: Dict[int, int] = {}
    for rep, peer, numel in zip(send_rep, send_peer, send_numel):
        key = rep * world + peer
        per_link[key] = per_link.get(key, 0) + numel * itemsize
    return OneStep(times.tolist(), messages.tolist(), sent.tolist(), received.tolist(), per_link,
                   net_bytes.tolist(), net_busy.tolist(), int(hop_bytes), net)


def link_kinds(net):
    """Each link's source host and kind (2·dimension + 1 forward, + 0 backward) on a torus,
    and the link of each kind from each host (-1: none): a translation of the torus moves a
    link to the link of its kind from its moved source."""
    dims = net.params["dims"]
    link_host = np.array([link.src for link in net.links], dtype=np.int64)
    link_kind = np.empty(len(net.links), dtype=np.int64)
    host_link = np.full((net.hosts, 2 * len(dims)), -1, dtype=np.int64)
    for i, link in enumerate(net.links):
        here, there = net.coords(link.src), net.coords(link.dst)
        dim = next(d for d, (a, b) in enumerate(zip(here, there)) if a != b)
        link_kind[i] = 2 * dim + ((there[dim] - here[dim]) % dims[dim] == 1)
        host_link[link.src, link_kind[i]] = i
    return link_host, link_kind, host_link


def _routes(net, sources, peers, link_host, link_kind, host_link):
    """The routes from host ``sources[i]`` to host ``peers[i]`` on a torus, as (offsets,
    link ids) with route i at ``links[offsets[i]:offsets[i + 1]]``: host 0's route to the
    peer moved back by the source, moved forward by it (dimension-order routing, the
    shorter way round, ties forward, is the same from every host: translations keep it),
    so that only host 0's routes run through :meth:`Network.route`."""
    from ._batch_clock import translate_routes
    dims = np.array(net.params["dims"], dtype=np.int64)
    strides = np.cumprod(np.concatenate(([1], dims[:-1])))
    coords = (np.arange(net.hosts, dtype=np.int64)[:, None] // strides) % dims     # host -> coordinates
    origin, flat = [0], []
    for host in range(net.hosts):
        flat.extend(net.route(0, host))
        origin.append(len(flat))
    return translate_routes(np.array(origin, dtype=np.int64), np.array(flat, dtype=np.int64),
                            np.asarray(sources, dtype=np.int64), np.asarray(peers, dtype=np.int64),
                            coords, dims, strides, link_host, link_kind, host_link)
