"""ringcoll: torch.distributed's collectives rebuilt from scratch on point-to-point send/recv.

    import ringcoll
    ringcoll.all_reduce(tensor, op=ringcoll.ReduceOp.SUM, algorithm="ring")

Algorithms are schedules (:mod:`ringcoll.schedule`) registered by collective and name
(:func:`algorithms`); the P2P executor runs them on a process group, :func:`simulate` runs
them on every rank in one process, and :func:`launch` starts a local cluster to try them.
"""
from .registry import algorithms
from .cluster import launch
from . import collectives
from .collectives import *  # noqa: F401,F403 - the drop-ins, one module each
from .executor import GroupFailedError, MismatchError, PeerError, get_timeout, set_timeout
from .ops import ReduceOp
from .selection import configure_logging
from .simulate import simulate
from .work import WaitTimeout, Work

configure_logging()

__version__ = "0.1.0"
__all__ = ["GroupFailedError", "MismatchError", "PeerError", "ReduceOp", "WaitTimeout", "Work",
           "algorithms", "get_timeout", "launch", "set_timeout",
           "simulate", *collectives.__all__]
