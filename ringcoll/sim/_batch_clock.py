"""The compiled clock of :mod:`ringcoll.sim.batch` (numba; imported on first use, its machine code
cached on disk beside this file): the event clock (:class:`ringcoll.sim.clock.Clock`) for a
world whose every rank posts one step, its phases stated beside their twins below
(``posting_order``, ``run``'s release loop, ``take``, ``count_message``, ``unhold``; the
per-message path stays in one loop of plain arrays, its helpers inlined: state passed in tuples cost
a third more time). ``fit``, ``insert`` and ``slot`` mirror the event clock's ``_fit``, ``hold``
and ``slot`` operation for operation; tests/sim/test_batch.py holds the two clocks to equal
statistics."""
from __future__ import annotations

import numba
import numpy as np

jit = numba.njit(cache=True, error_model="numpy")
inline = numba.njit(cache=True, error_model="numpy", inline="always")

# A lane's busy intervals, sorted and disjoint, live in its row of ``busy``, whole cache
# lines of 8 floats: interval i < n from ``busy[lane, 8 + 2i]`` to ``busy[lane, 9 + 2i]``
# after a first line that a slot mostly decides from alone: the start of the first
# interval (inf: none), the end of the last (-inf), n, the start of the last (inf: none), the
# start and end of the one before it (inf: none).
HEAD, TAIL, COUNT, LAST, BEFORE, BEFORE_END = 0, 1, 2, 3, 4, 5
FIRST = 8


@inline
def fit(busy, lane, t, duration):
    """The event clock's _fit: the earliest time >= t from which the lane is free for
    ``duration``, scanning from the last interval that starts at or before t (bisect_right
    on (t, inf)); and the start of the interval after it (inf: none), the end of the free
    span found. Where t is past the start of the last interval but one, from the row's
    first line alone: t is mostly there."""
    if busy[lane, TAIL] <= t:
        return t, np.inf                # idle from t on
    if busy[lane, HEAD] >= t + duration:
        return t, busy[lane, HEAD]      # long enough before its first interval
    if duration > 0 and busy[lane, LAST] <= t:
        return busy[lane, TAIL], np.inf         # inside the last interval
    if duration > 0 and busy[lane, BEFORE] <= t:
        t = max(t, busy[lane, BEFORE_END])
        if busy[lane, LAST] >= t + duration:
            return t, busy[lane, LAST]
        return busy[lane, TAIL], np.inf
    n = int(busy[lane, COUNT])
    i = n - 1
    while i > 0 and busy[lane, FIRST + 2 * i] > t:
        i -= 1
    while i < n:
        b_start, b_end = busy[lane, FIRST + 2 * i], busy[lane, FIRST + 1 + 2 * i]
        i += 1
        if b_end <= t:
            continue
        if b_start >= t + duration:
            return t, b_start
        t = b_end
    return t, np.inf


@inline
def insert(busy, lane, now, start, stop, merge):
    """The event clock's booking of (start, stop) on a lane (room for one more interval
    assured): the intervals that end by ``now`` dropped (here: by the bound below which no
    booking starts), then a merge with touching neighbours (or a plain sorted insert)."""
    n = int(busy[lane, COUNT])
    if n and busy[lane, FIRST - 1 + 2 * n] <= now:
        n = 0
    else:
        drop = 0
        while drop < n and busy[lane, FIRST + 1 + 2 * drop] <= now:
            drop += 1
        if drop:
            n -= drop
            for k in range(FIRST, FIRST + 2 * n):
                busy[lane, k] = busy[lane, k + 2 * drop]
    i = n                                       # bisect_left on (start, stop), from the end
    while i > 0 and (busy[lane, FIRST - 2 + 2 * i] > start or
                     (busy[lane, FIRST - 2 + 2 * i] == start and busy[lane, FIRST - 1 + 2 * i] >= stop)):
        i -= 1
    if merge and i < n and busy[lane, FIRST + 2 * i] == stop:
        stop = busy[lane, FIRST + 1 + 2 * i]
        if i > 0 and busy[lane, FIRST - 1 + 2 * i] == start:
            busy[lane, FIRST - 1 + 2 * i] = stop
            for k in range(FIRST + 2 * i, FIRST - 2 + 2 * n):
                busy[lane, k] = busy[lane, k + 2]
            n -= 1
        else:
            busy[lane, FIRST + 2 * i] = start
            busy[lane, FIRST + 1 + 2 * i] = stop
    elif merge and i > 0 and busy[lane, FIRST - 1 + 2 * i] == start:
        busy[lane, FIRST - 1 + 2 * i] = stop
    else:
        for k in range(FIRST + 1 + 2 * n, FIRST + 1 + 2 * i, -1):
            busy[lane, k] = busy[lane, k - 2]
        busy[lane, FIRST + 2 * i] = start
        busy[lane, FIRST + 1 + 2 * i] = stop
        n += 1
    busy[lane, COUNT] = n
    busy[lane, HEAD] = busy[lane, FIRST] if n else np.inf
    busy[lane, TAIL] = busy[lane, FIRST - 1 + 2 * n] if n else -np.inf
    busy[lane, LAST] = busy[lane, FIRST - 2 + 2 * n] if n else np.inf
    busy[lane, BEFORE] = busy[lane, FIRST - 4 + 2 * n] if n > 1 else np.inf
    busy[lane, BEFORE_END] = busy[lane, FIRST - 3 + 2 * n] if n > 1 else np.inf


@inline
def slot(busy, base, count, durations, ntab, floor, chosen, fits, spans):
    """The least t >= floor at which every table (``count[k]`` lanes from ``base[k]``) has a
    lane free for its duration, and each table's lane there (``chosen``): the event clock's
    slot, with each table's earliest fit kept from the t it was found at (``fits``), and for
    a table of one lane the end of the free span from it (``spans``). A table's earliest
    fit never decreases as t grows, and is the same from any t up to it, so it is found
    again only once t passes it, and not even then while t and the duration still lie in its
    free span (the very comparison _fit would make with the interval that ends it); t moves
    to any table's fit until every table fits at t: the least such t, as the event clock's
    rounds over all tables reach it. A table's lane is its first lane of least fit, as the
    event clock's (a table of several lanes is searched again once t moves past its fit: a
    lane before the one chosen may fit at the new t)."""
    t = floor
    for k in range(ntab):
        fits[k] = -1.0
        spans[k] = -1.0
    moved = True
    while moved:
        moved = False
        for k in range(ntab):
            d = durations[k]
            if fits[k] < t:
                if count[k] == 1 and d > 0 and spans[k] >= t + d:
                    fits[k] = t                 # still inside the free span found
                else:
                    least = np.inf
                    for lane in range(base[k], base[k] + count[k]):
                        f, span = fit(busy, lane, t, d)
                        if f < least:
                            least = f
                            chosen[k] = lane
                            spans[k] = span
                            if f == t:
                                break
                    fits[k] = least
            if fits[k] > t:
                t = fits[k]
                moved = True
    return t


@jit
def translate_routes(origin, flat, sources, peers, coords, dims, strides, link_host, link_kind, host_link):
    """Route i from host ``sources[i]`` to host ``peers[i]``: host 0's route (``flat[origin[h]:
    origin[h + 1]]`` to host h) to the peer moved back by the source, each of its links moved
    forward by the source (the link of its kind, ``host_link[host, link_kind[link]]``, from
    its moved source host). Returns (offsets, link ids), route i at ``[offsets[i]:offsets[i + 1]]``."""
    routes, ndims = sources.shape[0], dims.shape[0]
    back = np.empty(routes, dtype=np.int64)
    offsets = np.zeros(routes + 1, dtype=np.int64)
    for i in range(routes):
        host = 0
        for d in range(ndims):
            host += ((coords[peers[i], d] - coords[sources[i], d]) % dims[d]) * strides[d]
        back[i] = host
        offsets[i + 1] = offsets[i] + origin[host + 1] - origin[host]
    links = np.empty(offsets[routes], dtype=np.int64)
    for i in range(routes):
        at = offsets[i]
        for h in range(origin[back[i]], origin[back[i] + 1]):
            link = flat[h]
            host = 0
            for d in range(ndims):
                host += ((coords[link_host[link], d] + coords[sources[i], d]) % dims[d]) * strides[d]
            links[at] = host_link[host, link_kind[link]]
            at += 1
    return offsets, links


@jit
def rows(lanes, width):
    """``lanes`` rows of ``width`` floats (a multiple of 8), each starting a cache line, each
    lane empty."""
    flat = np.empty(lanes * width + 8, dtype=np.float64)
    skip = (-(flat.ctypes.data // 8)) % 8
    busy = flat[skip:skip + lanes * width].reshape((lanes, width))
    busy[:, HEAD] = np.inf
    busy[:, TAIL] = -np.inf
    busy[:, COUNT] = 0.0
    busy[:, LAST] = np.inf
    busy[:, BEFORE] = np.inf
    busy[:, BEFORE_END] = np.inf
    return busy


# -- the one-step clock, phase by phase beside the event clock (ringcoll.sim.clock.Clock) ----
# post: every rank posts its one step at time 0, so there is one due time and nothing to wake
#   in between; rank r's sends and receives are its representative's (send_pos, recv_index ...).
# match: a send meets the receive its peer posts for it (recv_pos, recv_index: one_step_clock
#   pairs them); Clock.run then sorts what matched at time 0 into posting order (send
#   position, receive position, sender): :func:`posting_order`.
# release: the stack loop in :func:`run`, Clock.release's stack in its order.
# book: Clock.book's floor, then :func:`take` (Clock.take and Clock.tables: the tables, the
#   slot, the interval holds), then :func:`count_message` (Routes.carry, Clock.count).
# wake: Clock.settle's step ends (in :func:`count_message`); each rank's end adds its γ at
#   the end of :func:`run`, where Clock.post would find its step done.
# report: :func:`run`'s return; messages held in a circle are status 1 (the caller declines
#   them, where the event clock would force the first by sender).

@jit
def posting_order(count, send_count, send_pos, recv_pos):
    """Each representative send's representative (``rep_of``) and the sends in the event
    clock's order, (send position, receive position, representative) (``reps``): every
    message is a run of them with one (send position, receive position) repeated for each
    shift k (sender rep + k·L: by k, then by representative, is by sender)."""
    sends = send_pos.shape[0]
    rep_of = np.empty(sends, dtype=np.int64)
    j = 0
    for rep in range(count):
        for _ in range(send_count[rep]):
            rep_of[j] = rep
            j += 1
    big = 1
    for j in range(sends):
        big = max(big, send_pos[j] + 1, recv_pos[j] + 1)
    return rep_of, np.argsort((send_pos * big + recv_pos) * count + rep_of, kind="mergesort")


@inline
def least_floor(world, count, send_count, recv_count, send_head, recv_head, send_floor, recv_floor):
    """The bound below which no booking starts: every message yet to book starts no earlier
    than its sender's last booked send (a rank's sends start in order) and its receiver's
    last receive, so intervals that end by the least of those can no longer move a booking
    (dropping them, as the event clock drops those that end by now, keeps lanes short)."""
    least_send, least_recv = np.inf, np.inf
    for r in range(world):
        if send_head[r] < send_count[r % count] and send_floor[r] < least_send:
            least_send = send_floor[r]
        if recv_head[r] < recv_count[r % count] and recv_floor[r] < least_recv:
            least_recv = recv_floor[r]
    bound = max(least_send, least_recv)
    return 0.0 if bound == np.inf else bound


@inline
def take(busy, width, base, count_of, durations, chosen, hop_link, fits, spans, first, last, lane0, lanes,
         moved, world, src_port, dst_port, ports, floor, send_after, recv_after, duration, wire, bound,
         positive, path_links, link_host, link_kind, host_link):
    """Clock.take over Clock.tables: the sender's send ports and the receiver's receive ports
    (from ``src_port``, ``dst_port``) for the message's time, its route's link lanes
    (``path_links[first:last]``, the representative's links moved by ``moved``) for its wire
    time; the slot from ``floor``, and each table's interval held (a port's intervals that
    end by ``send_after``/``recv_after`` dropped). Returns the start, the number of tables,
    the lanes' rows (widened where a lane is full) and their width."""
    base[0], count_of[0], durations[0] = src_port, ports, duration
    base[1], count_of[1], durations[1] = dst_port, ports, duration
    ntab = 2
    if wire > 0:
        for h in range(first, last):
            link = path_links[h]
            host = link_host[link] + moved
            link = host_link[host - world if host >= world else host, link_kind[link]]
            hop_link[ntab] = link
            base[ntab], count_of[ntab], durations[ntab] = lane0[link], lanes[link], wire
            ntab += 1
    start = slot(busy, base, count_of, durations, ntab, floor, chosen, fits, spans)
    for k in range(ntab):
        if FIRST + 2 * busy[chosen[k], COUNT] + 2 > width:
            wider = rows(busy.shape[0], 2 * width)
            wider[:, :width] = busy
            busy, width = wider, 2 * width
    insert(busy, chosen[0], send_after, start, start + duration, positive)
    insert(busy, chosen[1], recv_after, start, start + duration, positive)
    for k in range(2, ntab):
        insert(busy, chosen[k], bound, start, start + durations[k], True)
    return start, ntab, busy, width


@jit
def run(world, count, ports, alpha, gamma, itemsize, send_count, recv_count, send_pos, send_peer,
        send_numel, recv_pos, recv_index, send_index, path_ptr, path_links, path_alpha, path_beta,
        link_host, link_kind, host_link, lanes, reduced):
    """The clock of ``world`` ranks, rank r running representative ``r % count``'s one step
    with its peers and routes moved by ``r - r % count`` (:func:`ringcoll.sim.batch.one_step_clock`
    builds each array). Returns (0, or 1 where messages waited on each other in a
    circle; each rank's end; messages, bytes sent and received per rank; bytes and busy
    seconds per link; hop-bytes)."""
    sends = send_pos.shape[0]
    rep_of, reps = posting_order(count, send_count, send_pos, recv_pos)
    lane0, nlanes, most, longest, total = sizes(world, count, ports, send_count, recv_count, path_ptr, lanes)
    width = 40                          # floats per lane: 16 intervals, then twice as many floats
    busy = rows(nlanes, width)
    # per rank (Ranks): floors, step end, statistics, the heads of its sends and receives not
    # yet booked, and the message held back at each position (-1: none; allocated at the first hold)
    send_floor, recv_floor, step_end = np.zeros(world), np.zeros(world), np.zeros(world)
    messages, sent, received = (np.zeros(world, dtype=np.int64), np.zeros(world, dtype=np.int64),
                                np.zeros(world, dtype=np.int64))
    send_head, recv_head = np.zeros(world, dtype=np.int64), np.zeros(world, dtype=np.int64)
    held_send, held_recv = np.full((0, 0), -1, dtype=np.int64), np.full((0, 0), -1, dtype=np.int64)
    net_bytes, net_busy = np.zeros(lanes.shape[0], dtype=np.int64), np.zeros(lanes.shape[0])   # Routes
    # a booking's tables: first lane, lanes, duration, chosen lane, link, earliest fit, free span
    base, count_of, durations = np.empty(longest + 2, np.int64), np.empty(longest + 2, np.int64), np.empty(longest + 2)
    chosen, hop_link = np.empty(longest + 2, np.int64), np.empty(longest + 2, np.int64)
    fits, spans = np.empty(longest + 2), np.empty(longest + 2)
    stack, fresh = np.empty(16, dtype=np.int64), np.empty(16, dtype=np.bool_)
    positive = alpha > 0
    booked, held, hop_bytes, bound, number = 0, 0, 0, 0.0, 0
    run_start = 0
    while run_start < sends:
        run_end = run_start + 1
        while run_end < sends and send_pos[reps[run_end]] == send_pos[reps[run_start]] \
                and recv_pos[reps[run_end]] == recv_pos[reps[run_start]]:
            run_end += 1
        for shift in range(0, world, count):
            for q in range(run_start, run_end):
                if number % world == 0 and number:
                    bound = least_floor(world, count, send_count, recv_count, send_head, recv_head, send_floor,
                                        recv_floor)
                number += 1
                j = reps[q]
                # release: book the entry once it heads both its queues, then the held messages
                # that this lets through (the event clock's stack, in its order)
                stack[0], fresh[0], top = (rep_of[j] + shift) * sends + j, True, 1  # sender · sends + its send
                while top:
                    top -= 1
                    e = stack[top]
                    src, j = e // sends, e % sends
                    dst = (send_peer[j] + src - src % count) % world
                    si, ri = send_index[j], recv_index[j]
                    if not fresh[top]:
                        if held_send[src, si] != e:
                            continue
                        held -= 1
                        held_send[src, si] = -1
                        held_recv[dst, ri] = -1
                    if send_head[src] != si or recv_head[dst] != ri:
                        if held_send.shape[0] == 0:
                            held_send = np.full((world, most), -1, dtype=np.int64)
                            held_recv = np.full((world, most), -1, dtype=np.int64)
                        held += 1
                        held_send[src, si] = e
                        held_recv[dst, ri] = e
                        continue
                    send_head[src] += 1
                    recv_head[dst] += 1
                    # book: the message's time α_path + n·β_path from its floor, on its tables
                    nbytes = send_numel[j] * itemsize
                    wire = nbytes * path_beta[j]
                    duration = path_alpha[j] + wire
                    first, last = path_ptr[j], path_ptr[j + 1]
                    start, ntab, busy, width = take(
                        busy, width, base, count_of, durations, chosen, hop_link, fits, spans, first, last, lane0,
                        lanes, src - src % count, world, src * ports, (world + dst) * ports, ports,
                        max(0.0, send_floor[src], recv_floor[dst]), max(bound, send_floor[src]),
                        max(bound, recv_floor[dst]), duration, wire, bound, positive, path_links, link_host,
                        link_kind, host_link)
                    count_message(src, dst, nbytes, wire, start, start + duration, ntab, hop_link, net_bytes,
                                  net_busy, send_floor, recv_floor, messages, sent, received, step_end)
                    hop_bytes += nbytes * (last - first)
                    booked += 1
                    if top + 2 > stack.shape[0]:
                        stack = np.concatenate((stack, np.empty(stack.shape[0], dtype=np.int64)))
                        fresh = np.concatenate((fresh, np.empty(fresh.shape[0], dtype=np.bool_)))
                    if not held:
                        continue                    # (none held: the common case reads no table)
                    top = unhold(src, dst, count, send_head, recv_head, send_count, recv_count, held_send,
                                 held_recv, stack, fresh, top)
        run_start = run_end
    times = step_end + reduced[np.arange(world) % count] * gamma        # Clock.post at each step's end
    return (0 if booked == total and not held else 1), times, messages, sent, received, net_bytes, net_busy, hop_bytes


@inline
def count_message(src, dst, nbytes, wire, start, end, ntab, hop_link, net_bytes, net_busy, send_floor, recv_floor,
                  messages, sent, received, step_end):
    """A booked message's counts: its links' bytes and busy time (Routes.carry), its ends'
    floors and statistics (Clock.count), its steps' ends (Clock.settle)."""
    for k in range(2, ntab):
        net_bytes[hop_link[k]] += nbytes
        net_busy[hop_link[k]] += wire
    send_floor[src] = recv_floor[dst] = start
    messages[src] += 1
    sent[src] += nbytes
    received[dst] += nbytes
    step_end[src] = max(step_end[src], end)
    step_end[dst] = max(step_end[dst], end)


@jit
def sizes(world, count, ports, send_count, recv_count, path_ptr, lanes):
    """The lanes: world·ports send ports, world·ports receive ports, then each link's lanes
    from ``lane0[link]``; how many; the most sends or receives of one rank; the longest
    route; the messages in all."""
    lane0 = np.empty(lanes.shape[0], dtype=np.int64)
    nlanes = 2 * world * ports
    for i in range(lanes.shape[0]):
        lane0[i] = nlanes
        nlanes += lanes[i]
    most = 0
    for c in range(count):
        most = max(most, send_count[c], recv_count[c])
    longest = 0
    for j in range(path_ptr.shape[0] - 1):
        longest = max(longest, path_ptr[j + 1] - path_ptr[j])
    total = 0
    for r in range(world):
        total += send_count[r % count]
    return lane0, nlanes, most, longest, total


@inline
def unhold(src, dst, count, send_head, recv_head, send_count, recv_count, held_send, held_recv, stack, fresh,
           top):
    """Clock.release's next candidates after a booking: the message held at the head of the
    sender's sends, then the one at the head of the receiver's receives, pushed on the stack
    in that order. Returns the stack's new top."""
    for side in range(2):
        if side == 0:
            rank, head, queued, table = src, send_head[src], send_count[src % count], held_send
        else:
            rank, head, queued, table = dst, recv_head[dst], recv_count[dst % count], held_recv
        if head < queued and table[rank, head] >= 0:
            stack[top] = table[rank, head]
            fresh[top] = False
            top += 1
    return top
