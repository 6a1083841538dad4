"""ringcoll: torch.distributed's collectives rebuilt from scratch on point-to-point send/recv.

    import ringcoll
    ringcoll.all_reduce(tensor, op=ringcoll.ReduceOp.SUM, algorithm="ring")

Algorithms are schedules (:mod:`ringcoll.schedules.vocabulary`) registered by collective and name
(:func:`algorithms`); the P2P executor runs them on a process group, :func:`simulate` runs
them on every rank in one process, and :func:`launch` starts a local cluster to try them.

The packages, by layer, lowest first (a module imports only its own layer and those below;
tests/test_layers.py checks it on every module and lists the exceptions): ``ops`` and ``cost``
(machines and networks: what a message costs) < ``config`` (every setting, read once) <
``schedules`` (the vocabulary, the registry and one module per collective) < ``runtime``
(plan, executor, work, transport, the group's placement) and ``kernels`` < ``selection``
(rules, tuning table, model) < ``api`` (the drop-ins) and ``backend`` (the torch backend, the
DDP hook) < ``sim`` (the simulator and the study; its clock sits beside the runtime) and
``msccl`` < this package and the launcher < ``bench`` (ringcoll-bench, installed from the
checkout's top-level bench/, as ``kernels`` from kernels/). Nothing here imports the
checkout's tools/ or experiments/.
"""
from .schedules.registry import Cost, algorithms, register
from .sim import trust  # noqa: F401 - hands register its cost check (the simulator's clock)
from .cost.machine import Machine
from .cluster import launch
from . import api
from .api import *  # noqa: F403 - the drop-ins, one module each
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
