"""A call's identity on its group: its sequence number and fingerprint (collective, algorithm,
size, dtype, op, root) make its tags, and check mode exchanges the fingerprints
(``RINGCOLL_CHECK=1``) in fixed-size records."""
from __future__ import annotations

import struct
import zlib
from typing import Tuple

from ..config import settings
from ..schedules.vocabulary import ROOT
from .plan import Plan

#: ringcoll's tags lie in [TAG_BASE, 2 * TAG_BASE): gloo takes int32 tags >= 0, user code and
#: torch's own send/recv use small ones (0 by default)
TAG_BASE = 1 << 30
_SEQ_BITS, _PRINT_BITS = 12, 18
#: the tag of check mode's fingerprint exchange (print bits 0: never a call's tag)
CHECK_TAG = TAG_BASE

#: collectives whose element count differs between ranks of one call (and whose ranks may
#: pick different, interoperating algorithms): their fingerprint leaves both out
RANK_VARYING = frozenset({"all_to_all"})


# -- call identity ------------------------------------------------------------------------
FIELDS = ("collective", "algorithm", "numel", "dtype", "op", "root")


def fingerprint(plan: Plan) -> Tuple:
    """What every rank of one call agrees on: (collective, algorithm, element count, dtype,
    local op, root); None where ranks may legitimately differ or it does not apply."""
    varying = plan.collective in RANK_VARYING
    return (plan.collective, None if varying else plan.algorithm.name,
            None if varying else plan.layout.numel, str(plan.dtype).replace("torch.", ""),
            plan.op, plan.layout.get(ROOT))


def _code(value) -> int:
    return zlib.crc32(repr(value).encode())


def print_bits(print_: Tuple) -> int:
    """The fingerprint's part of a call's tag: never 0 (check mode's tag)."""
    return 1 + _code(print_) % ((1 << _PRINT_BITS) - 1)


def tag_of(seq: int, bits: int) -> int:
    return TAG_BASE | ((seq & ((1 << _SEQ_BITS) - 1)) << _PRINT_BITS) | bits


def call_tag(seq: int, print_: Tuple) -> int:
    """The tag of every message of call ``seq`` with fingerprint ``print_``: calls within
    4096 of each other never share a tag, two different calls at the same number share one
    with probability 2**-18 (and gloo then refuses the size if that differs)."""
    return tag_of(seq, print_bits(print_))


#: the tag of the receive that closes a failed group's gloo connections
#: (transport.base.close_gloo): fingerprint bits 0 are never a call's, sequence bits 2 neither
#: check mode's (0) nor the layout exchange's (1, nodes.PLACEMENT_TAG); nothing is ever sent on it
CLOSE_TAG = tag_of(2, 0)


def check_enabled() -> bool:
    return settings().check


MONITORED = ("monitored_barrier", None, 1, "uint8", None, 0)

RECORD = struct.Struct("<qqq24s24s24s24s")


def pack_record(seq: int, print_: Tuple) -> bytes:
    collective, algorithm, numel, dtype, op, root = print_
    text = [str(value if value is not None else "-").encode()[:24] for value in (collective, algorithm, dtype, op)]
    return RECORD.pack(seq, -1 if numel is None else numel, -1 if root is None else root, *text)


def unpack_record(record: bytes) -> Tuple:
    seq, numel, root, collective, algorithm, dtype, op = RECORD.unpack(record)
    text = [value.rstrip(b"\0").decode() for value in (collective, algorithm, dtype, op)]
    return (seq, text[0], text[1], numel, text[2], text[3], root)
