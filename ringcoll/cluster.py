"""A local cluster: world_size ranks on localhost, kept alive to run functions on every rank.

    with ringcoll.launch(4) as cluster:
        results = cluster.run(fn, 1024)      # fn(1024) on every rank; results[r] is rank r's

``fn`` must be picklable (a module-level function). A rank's exception is re-raised in the
caller, with its rank and its remote traceback; a rank that dies or does not answer within
the timeout brings the cluster down and raises, naming the ranks. No process outlives the
cluster: children are killed on close, on error and when the parent dies.

Under torchrun (the env:// variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), no
process is spawned: the existing group is used (initialised from env:// if needed), ``run``
calls ``fn`` on this rank and gathers every rank's result.

NCCL needs one GPU per rank on each host (it refuses two ranks on one device: "Duplicate GPU
detected"). ``launch(n, "nccl")`` checks that before it spawns anything, and each torchrun rank
checks its LOCAL_RANK and LOCAL_WORLD_SIZE before it initialises NCCL, so a missing GPU is one
clear error on every rank instead of a hang on some and an opaque NCCL error on others. Many ranks
can share one GPU over gloo (CUDA tensors are staged through host memory).
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import time
import traceback
import weakref
from typing import Any, Callable, List, Optional

_BACKENDS = ("gloo", "nccl", "ringcoll")     # "ringcoll": this package as the torch backend


class RemoteTraceback(Exception):
    def __init__(self, text: str):
        super().__init__(text)

    def __str__(self) -> str:
        return self.args[0]


class ClusterError(RuntimeError):
    """The cluster itself failed: a rank died, or did not answer in time."""


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def check_gpus(ranks_here: Optional[int], local_rank: Optional[int] = None) -> None:
    """Raise RuntimeError, naming the fix, unless this host has a GPU for each of ``ranks_here``
    NCCL ranks and for ``local_rank`` (each when given). Rank r of a host uses GPU r."""
    import torch

    count = torch.cuda.device_count()
    gloo = ("Use backend='gloo' (ringcoll-bench --backend gloo): it stages CUDA tensors through "
            "host memory, so any number of ranks can share a GPU")
    if count == 0:
        raise RuntimeError(f"backend='nccl' needs a CUDA device per rank, but torch sees none "
                           f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}, "
                           f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). "
                           f"{gloo}, with CUDA or CPU tensors.")
    fewer = f"{gloo}; or start at most {count} rank(s) per host."
    if ranks_here is not None and ranks_here > count:
        raise RuntimeError(f"backend='nccl' needs one GPU per rank: {ranks_here} ranks on this "
                           f"host, {count} CUDA device(s) visible; NCCL refuses two ranks on one "
                           f"GPU ('Duplicate GPU detected'). {fewer}")
    if local_rank is not None and not 0 <= local_rank < count:
        raise RuntimeError(f"backend='nccl': LOCAL_RANK={local_rank} has no GPU, this host has "
                           f"{count} CUDA device(s) (0..{count - 1}). {fewer}")


def _torchrun_local() -> tuple:
    """(LOCAL_RANK, ranks on this host or None) from torchrun's variables."""
    here = os.environ.get("LOCAL_WORLD_SIZE")
    return int(os.environ.get("LOCAL_RANK", 0)), (int(here) if here else None)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank_main(rank: int, world: int, backend: str, port: int, conn, threads: int,
               timeout_s: float) -> None:
    _die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)     # the parent checked there is one GPU per rank
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        conn.send(("ready", None))
    except BaseException as error:  # noqa: BLE001
        conn.send(("error", _pack(error)))
        return
    while True:
        try:
            blob = conn.recv_bytes()
        except EOFError:
            break
        try:
            message = pickle.loads(blob)
        except BaseException as error:  # noqa: BLE001 - fn or an argument this rank cannot import
            conn.send(("error", _pack(_not_importable(rank, error))))
            continue
        if message is None:
            break
        fn, args, kwargs = message
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the parent
            conn.send(("error", _pack(error)))
        else:
            try:
                conn.send(("ok", result))
            except Exception as error:  # noqa: BLE001 - an unpicklable result
                conn.send(("error", _pack(error)))
    conn.close()
    os._exit(0)     # no teardown handshake with the peers: they are all stopping too


def _not_importable(rank: int, error: BaseException) -> TypeError:
    return TypeError(
        f"cluster.run: rank {rank} cannot load the function or its arguments: "
        f"{type(error).__name__}: {error}. The ranks are fresh processes that import fn by its "
        f"module and name, so fn must be defined in an importable module or in the script run "
        f"as a file, not in `python -c`, a script read from stdin, a notebook cell or an "
        f"interactive session")


def _hide_unreadable_main():
    """A spawned child re-runs the parent's main script from its ``__file__``; a script read
    from stdin (``__file__`` '<stdin>') has no file to re-run and every child would die at
    start. Hide such a ``__file__`` while the children start (as multiprocessing does for an
    interactive session); their ``run`` then names what they cannot import."""
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None or os.path.isfile(path):
        return None
    del main.__file__
    return path


def _restore_main(path) -> None:
    if path is not None:
        import sys

        sys.modules["__main__"].__file__ = path


def _pack(error: BaseException):
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        blob = pickle.dumps(error)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001
        blob = pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))
    return blob, text


def _unpack(rank: int, packed) -> BaseException:
    blob, text = packed
    error = pickle.loads(blob)
    error.__cause__ = RemoteTraceback(f"\n\n--- rank {rank} ---\n{text}")
    if hasattr(error, "add_note"):
        error.add_note(f"(raised on rank {rank} of the ringcoll cluster)")
    return error


_live: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for cluster in list(_live):
        cluster.close()


class Cluster:
    """See the module docstring. Build it with :func:`launch`."""

    def __init__(self, world_size: Optional[int], backend: str = "gloo", *,
                 timeout: float = 300.0, start_timeout: float = 120.0,
                 threads: Optional[int] = None, env: Optional[dict] = None):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        self.backend = backend
        self.timeout = timeout
        self.external = under_torchrun()
        self._procs: List[mp.Process] = []
        self._conns: list = []
        self._store = None
        if self.external:
            import torch.distributed as dist

            self._owns_group = not dist.is_initialized()
            if self._owns_group:
                if backend == "nccl":           # one GPU per local rank, before NCCL starts
                    import torch

                    local_rank, ranks_here = _torchrun_local()
                    check_gpus(ranks_here, local_rank)
                    torch.cuda.set_device(local_rank)
                dist.init_process_group(backend, init_method="env://")
            actual = dist.get_world_size()
            if world_size is not None and world_size != actual:
                raise ValueError(f"world_size must match torchrun's WORLD_SIZE={actual}, got {world_size}")
            self.world_size = actual
            return
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.world_size = world_size
        if backend == "nccl":
            check_gpus(world_size)          # before any process or NCCL communicator exists
        import torch.distributed as dist

        self._store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                                    wait_for_workers=False)
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // world_size)
        context = mp.get_context("spawn")
        saved = dict(os.environ)
        os.environ.update(env or {})        # a spawned child starts from the parent's environment
        hidden = _hide_unreadable_main()
        try:
            for rank in range(world_size):
                parent, child = context.Pipe()
                proc = context.Process(
                    target=_rank_main, name=f"ringcoll-rank{rank}", daemon=True,
                    args=(rank, world_size, backend, self._store.port, child, threads, timeout))
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            _restore_main(hidden)
        _live.add(self)
        try:
            self._collect(start_timeout, what="start")
        except BaseException:
            self.close()
            raise

    # -- running ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.external or (bool(self._procs) and all(p.is_alive() for p in self._procs))

    def run(self, fn: Callable[..., Any], *args, timeout: Optional[float] = None, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank; the list of results, rank by rank."""
        if self.external:
            import torch.distributed as dist

            result = fn(*args, **kwargs)
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, result)
            return gathered
        if not self.alive:
            raise ClusterError("the cluster is closed or lost a rank; launch a new one")
        try:
            blob = pickle.dumps((fn, args, kwargs))
        except Exception as error:
            raise TypeError(f"cluster.run: fn and its arguments must be picklable (fn a module-level "
                            f"function), got {fn!r}: {type(error).__name__}: {error}") from error
        for conn in self._conns:
            conn.send_bytes(blob)
        return self._collect(self.timeout if timeout is None else timeout,
                             what=getattr(fn, "__name__", repr(fn)))

    def _collect(self, timeout: float, what: str) -> list:
        deadline = time.monotonic() + timeout
        results: dict = {}
        errors: dict = {}
        pending = dict(enumerate(self._conns))
        sentinels = {p.sentinel: rank for rank, p in enumerate(self._procs)}
        grace_deadline = None
        while pending:
            now = time.monotonic()
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            if now >= limit:
                break
            ready = mp.connection.wait(list(pending.values()) + [
                s for s, r in sentinels.items() if r in pending], timeout=limit - now)
            for item in ready:
                rank = sentinels.get(item)
                ended = rank is not None
                if rank is None:
                    rank = next((r for r, c in pending.items() if c is item), None)
                if rank is None or rank not in pending:
                    continue
                conn = pending[rank]
                try:
                    if ended and not conn.poll():
                        raise EOFError              # the process ended without a last word
                    status, payload = conn.recv()
                except (EOFError, OSError):
                    self._procs[rank].join(1.0)
                    code = self._procs[rank].exitcode
                    self.close()
                    raise ClusterError(f"rank {rank} died (exit code {code}) during {what}") from None
                del pending[rank]
                if status == "error":
                    errors[rank] = payload
                    if grace_deadline is None:      # the others may now wait on it forever
                        grace_deadline = time.monotonic() + min(10.0, timeout)
                else:
                    results[rank] = payload
        if pending:
            stuck = sorted(pending)
            self.close()
            if errors:
                first = min(errors)
                raise _unpack(first, errors[first])
            raise ClusterError(f"ranks {stuck} did not finish {what} within {timeout:.0f} s; "
                               f"the cluster was shut down")
        if errors:
            first = min(errors)
            raise _unpack(first, errors[first])
        return [results[rank] for rank in range(self.world_size)]

    # -- closing ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every rank; kill those that do not stop within a few seconds."""
        if self.external:
            import torch.distributed as dist

            if self._owns_group and dist.is_initialized():
                dist.barrier()           # no rank tears its connections down under a peer
                dist.destroy_process_group()
            self._owns_group = False
            return
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        self._store = None
        _live.discard(self)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if not getattr(self, "external", True):
                self.close()
        except Exception:  # noqa: BLE001
            pass


def launch(world_size: Optional[int] = None, backend: str = "gloo", **options) -> Cluster:
    """Start ``world_size`` ranks on localhost (or join torchrun's group); a context manager.

    Options: ``timeout`` (s, per ``run`` and for the process group), ``start_timeout``,
    ``threads`` (torch threads per rank; default cores // world_size), ``env`` (variables set
    in every rank before torch is imported there).
    """
    return Cluster(world_size, backend, **options)
