"""ringcoll: torch.distributed's collectives rebuilt from scratch on point-to-point send/recv.

    import ringcoll
    ringcoll.all_reduce(tensor, op=ringcoll.ReduceOp.SUM, algorithm="ring")

Algorithms are schedules (:mod:`ringcoll.schedules.vocabulary`) registered by collective and name
(:func:`algorithms`); the P2P executor runs them on a process group, :func:`simulate` runs
them on every rank in one process, and :func:`launch` starts a local cluster to try them.

The packages, by layer, lowest first (a module imports only its own layer and those below;
tests/test_layers.py checks it on every module and lists what is still to untangle):
``ops`` and ``schedules.vocabulary`` (the words a schedule is written in) < ``config`` (every
setting, read once) < ``schedules`` (the registry and one module per collective) < ``runtime``
(plan, executor, work, transport, the group's node layout) and ``kernels`` < ``selection``
(rules, tuning table, model) < ``api`` (the drop-ins) and ``backend`` (the torch backend, the
DDP hook) < ``sim`` (the simulator and the study) and ``msccl`` < this package, the launcher and
the command lines < ``bench`` (ringcoll-bench). Nothing here imports the checkout's tools/ or
experiments/; the pre-split module paths (``ringcoll.executor``, ``ringcoll.schedule``, ...)
still import, with a DeprecationWarning (:mod:`ringcoll._moved`).
"""
from . import _moved

_moved.install()

from .schedules.registry import Cost, algorithms, register
from .sim import trust  # noqa: F401 - hands register its cost check (the simulator's clock)
from .sim.machine import Machine
from .cluster import launch
from . import api
from .api import *  # noqa: F401,F403 - the drop-ins, one module each
from .runtime.failures import GroupFailedError, MismatchError, PeerError, get_timeout, set_timeout
from .ops import ReduceOp
from .selection import configure_logging
from .sim.simulate import simulate
from .sim.fit import fit
from .runtime.work import WaitTimeout, Work
from .backend import Options, register as _register_backend
from .backend.hooks import ddp_comm_hook

configure_logging()
_register_backend()

__version__ = "0.1.0"
__all__ = ["Cost", "GroupFailedError", "Machine", "MismatchError", "Options", "PeerError", "ReduceOp",
           "WaitTimeout", "Work", "algorithms", "ddp_comm_hook", "fit", "register", "get_timeout", "launch",
           "set_timeout",
           "simulate", *api.__all__]
