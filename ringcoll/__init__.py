"""ringcoll: torch.distributed's collectives rebuilt from scratch on point-to-point send/recv.

    import ringcoll
    ringcoll.all_reduce(tensor, op=ringcoll.ReduceOp.SUM, algorithm="ring")

Algorithms are schedules (:mod:`ringcoll.schedule`) registered by collective and name
(:func:`algorithms`); the P2P executor runs them on a process group, :func:`simulate` runs
them on every rank in one process, and :func:`launch` starts a local cluster to try them.

Layers, lowest first; a module imports only its own layer and those below (tests/test_layers.py
checks it on every module, and lists what is still to untangle):
models and vocabulary (ops, machine, schedule) < settings (config) < algorithms (registry,
plan, schedules) < runtime (kernels, local, transport, work, executor; the simulator's engine)
< selection (topology, selection) < api (collectives, backend, hooks) < simulation front
(simulate, study's sweep) < entry points (this package, the launcher, the command lines) <
the benchmark (ringcoll.bench). Nothing here imports the checkout's tools/ or experiments/.
"""
from .registry import Cost, algorithms
from .study.trust import register
from .machine import Machine
from .cluster import launch
from . import collectives
from .collectives import *  # noqa: F401,F403 - the drop-ins, one module each
from .executor import GroupFailedError, MismatchError, PeerError, get_timeout, set_timeout
from .ops import ReduceOp
from .selection import configure_logging
from .simulate import simulate
from .study.fit import fit
from .work import WaitTimeout, Work
from .backend import Options, register as _register_backend
from .hooks import ddp_comm_hook

configure_logging()
_register_backend()

__version__ = "0.1.0"
__all__ = ["Cost", "GroupFailedError", "Machine", "MismatchError", "Options", "PeerError", "ReduceOp",
           "WaitTimeout", "Work", "algorithms", "ddp_comm_hook", "fit", "register", "get_timeout", "launch",
           "set_timeout",
           "simulate", *collectives.__all__]
