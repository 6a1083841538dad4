"""Device streams and events as ringcoll's stream-ordered path uses them: CUDA's, or an emulator's.

The stream-ordered path (:mod:`ringcoll.runtime.transport.stream_ordered`) enqueues a whole collective on one
stream of ringcoll's per (group, device): an event of the caller's current stream first, then
per step one coalesced batch, the wait that orders the stream after it, and the step's copies
and reductions, then the call's end event. The executor only calls :class:`StreamRuntime`'s
methods, so the same code runs on two implementations:

- :class:`CudaRuntime`: ``torch.cuda.Stream``/``Event``; ``launch(stream, fn)`` calls ``fn``
  at once with ``stream`` current, so the kernels and NCCL calls ``fn`` issues are enqueued on
  it and the host goes on.
- :class:`EmulatedRuntime`: a CPU stand-in in which every stream is a thread that runs the
  device work launched on it in enqueue order (FIFO), an event is recorded when its stream
  reaches it, and ``wait(stream, event)`` blocks that stream's thread, not the host. As on a
  GPU, ``launch(stream, fn)`` runs ``fn``'s Python on the caller's thread at once (its checks,
  compiles and allocations, and their errors, happen at enqueue); only the work that reads or
  writes tensor data goes to the stream (:class:`_Deferring`, :func:`device_work`). Collective batches
  launched on such a stream really move bytes (over a private gloo group, see
  :class:`ringcoll.runtime.transport.stream_ordered.EmulatedNccl`), so a whole call runs with the host never
  waiting, and tests can hold a stream with a gate to show that a call returned before its
  data arrived.

``host_waits`` counts every time the host blocks on a stream or event through the runtime
(:meth:`synchronize`): the stream-ordered path takes none per collective (barrier, check mode
and exchanges whose results the host reads take one each, by contract).
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
import weakref
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import kernels


class StreamRuntime:
    """What the stream-ordered path needs of a device: streams, events, futures."""

    #: how many times the host blocked on a stream or event through this runtime
    host_waits = 0

    def __init__(self):
        self._free_streams: dict = {}    # released streams per (device type, index)
        self._streams_lock = threading.Lock()
        self._events: list = []          # events free for reuse (see reuse)
        self._events_lock = threading.Lock()

    def current(self, device: torch.device):
        """The calling thread's current stream on ``device``."""
        raise NotImplementedError

    def on_device(self, device: torch.device):
        """A context in which ``device`` is the current device."""
        return contextlib.nullcontext()

    def new_stream(self, device: torch.device):
        """A stream of ringcoll's own on ``device``, used by no one else until
        :meth:`release_stream` gives it back: one a released transport left (after its last
        call), else a new one (:meth:`_create_stream`)."""
        key = (device.type, device.index)
        with self._streams_lock:
            free = self._free_streams.get(key)
            if free:
                return free.pop()
        return self._create_stream(device)

    def release_stream(self, stream) -> None:
        """``stream`` back to ringcoll's pool once nothing of its user's remains to run on it (its
        transport shut down, its last call settled): a later transport may take it. Never
        destroyed while the process lives: the caching allocator records an event on the stream
        of every tensor ``record_stream`` named it for when that tensor is freed, which may be
        any time later (a user's tensor), and an event recorded on a destroyed stream is a CUDA
        error inside a free."""
        key = (stream.device.type, stream.device.index)
        with self._streams_lock:
            self._free_streams.setdefault(key, []).append(stream)

    def _create_stream(self, device: torch.device):
        raise NotImplementedError

    def launch(self, stream, fn: Callable[[], None], on_error: Optional[Callable] = None,
               touched: Optional[list] = None) -> None:
        """Enqueue ``fn``'s work on ``stream``: ``fn`` runs now, on the calling thread (its
        Python, checks, kernel compiles, allocations: the host's part, whose errors raise here),
        and the device work it issues goes on ``stream``. ``on_error``: told of an error of
        that device work where it is known (the emulator's). ``touched``: the tensors that
        ``fn``'s operations read or write are appended to it (what the call must keep alive)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def allocating(self, stream):
        """Allocate under this context the buffers that ``stream`` uses: their memory then
        belongs to ``stream`` in a caching allocator (freed, it is reused in its order)."""
        yield

    def record(self, stream):
        """An event recorded on ``stream`` now (completes when the stream reaches it): one of
        :meth:`reuse`'s, else a new one."""
        raise NotImplementedError

    def reuse(self, events) -> None:
        """``events`` (completed, and read by no one any more) back to the pool :meth:`record`
        takes from: events are reused, never destroyed on the watchdog's thread."""
        with self._events_lock:
            self._events.extend(event for event in events if event is not None)

    def _reused_event(self):
        """An event from the pool :meth:`reuse` fills, or None."""
        with self._events_lock:
            return self._events.pop() if self._events else None

    def watching(self, device: torch.device):
        """The context the watchdog reads a call's events in: ``device`` current and the thread's
        stream-capture mode relaxed (a query is then legal while another thread captures)."""
        return contextlib.nullcontext()

    def wait(self, stream, event) -> None:
        """Order ``stream`` after ``event``; the host does not block."""
        raise NotImplementedError

    def query(self, event) -> bool:
        """Whether ``event`` has completed (never blocks)."""
        raise NotImplementedError

    def synchronize(self, event) -> None:
        """Block the host until ``event`` completes (counted in :attr:`host_waits`)."""
        raise NotImplementedError

    def capturing(self, device: torch.device) -> bool:
        """Whether the calling thread's current stream on ``device`` is capturing a graph."""
        return False

    def host_reads(self, device: torch.device) -> bool:
        """Whether the host reads tensors on ``device`` at once, with no stream to order its
        reads after a call (CPU memory): a synchronous call and ``Work.wait()`` then block the
        host until the call has ended, as gloo's do. False for device memory, which the host
        reads only through a synchronisation (CUDA: ``.cpu()``, ``.item()``)."""
        return False

    #: whether :meth:`new_future` gives stream-aware futures (else a call's future completes
    #: on the host once the watchdog has seen the call end)
    stream_aware_futures = False

    def new_future(self, device: torch.device) -> torch.futures.Future:
        """A future for a call's result on ``device``."""
        return torch.futures.Future()

    def complete(self, future: torch.futures.Future, stream, result) -> None:
        """Complete ``future`` with ``result`` in ``stream``'s order."""
        raise NotImplementedError

    def keep_alive(self, tensors, stream) -> None:
        """Tell the allocator that ``stream`` uses ``tensors`` (CUDA: ``record_stream``)."""


class CudaRuntime(StreamRuntime):
    """CUDA's streams and events (``torch.cuda``)."""

    stream_aware_futures = True

    def current(self, device):
        return torch.cuda.current_stream(device)

    def on_device(self, device):
        return torch.cuda.device(device)

    def _create_stream(self, device):
        """A CUDA stream created for ringcoll (``cudaStreamCreateWithPriority``: non-blocking,
        as torch's own streams, and priority 0, torch's default), wrapped in
        ``torch.cuda.ExternalStream``. Not ``torch.cuda.Stream()``: that hands out torch's pool of
        32 streams per device round robin, from which ProcessGroupNCCL's internal streams and every
        other ``torch.cuda.Stream()`` come too, so ringcoll's stream could be another group's or
        NCCL's very stream (their work silently serialised, a false dependency across ranks)."""
        import ctypes

        create = _cudart_function("cudaStreamCreateWithPriority",
                                  (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int))
        if create is None:
            raise RuntimeError("ringcoll: no CUDA runtime library is loaded in this process (a CPU build of torch?)")
        handle = ctypes.c_void_p()
        with torch.cuda.device(device):
            status = create(ctypes.byref(handle), STREAM_NON_BLOCKING, 0)
        if status != 0 or not handle.value:
            raise RuntimeError(f"ringcoll: cudaStreamCreateWithPriority on {device} failed with CUDA "
                               f"error {status}")
        return torch.cuda.ExternalStream(handle.value, device=device)

    def launch(self, stream, fn, on_error=None, touched=None):
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            if touched is None:
                fn()
            else:
                with _Recording(touched):
                    fn()

    @contextlib.contextmanager
    def allocating(self, stream):
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            yield

    def record(self, stream):
        event = self._reused_event()
        if event is None:
            event = torch.cuda.Event()
        event.record(stream)
        return event

    @contextlib.contextmanager
    def watching(self, device):
        """torch's watchdog's guards: a ``CUDAGuard`` on the call's device and a thread-local
        ``cudaStreamCaptureModeRelaxed`` (torch has no Python binding for
        ``cudaThreadExchangeStreamCaptureMode``: it is called from the CUDA runtime torch
        loaded; without one, no capture can be running either)."""
        exchange = _capture_mode_exchange()
        with torch.cuda.device(device):
            if exchange is None:
                yield
                return
            import ctypes
            mode = ctypes.c_int(CAPTURE_MODE_RELAXED)
            exchange(ctypes.byref(mode))         # mode now holds the thread's previous one
            try:
                yield
            finally:
                exchange(ctypes.byref(mode))

    def wait(self, stream, event):
        stream.wait_event(event)

    def query(self, event):
        return event.query()

    def synchronize(self, event):
        StreamRuntime.host_waits += 1
        event.synchronize()

    def capturing(self, device):
        if not torch.cuda.is_available():        # nothing can capture (and this build may lack CUDA)
            return False
        with torch.cuda.device(device):
            return torch.cuda.is_current_stream_capturing()

    def new_future(self, device):
        """A CUDA-aware future (``Future(devices=[device])``)."""
        return torch.futures.Future(devices=[device])

    def complete(self, future, stream, result):
        """Completed at once under ``stream``: torch records an event of ``stream`` in it, and
        whoever waits on it, reads its value or chains a callback has their current stream
        ordered after that event (as ProcessGroupNCCL's futures)."""
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            future.set_result(result)

    def keep_alive(self, tensors, stream):
        for tensor in tensors:
            if tensor.is_cuda:
                tensor.record_stream(stream)


#: cudaStreamCaptureMode's values (driver_types.h)
CAPTURE_MODE_GLOBAL, CAPTURE_MODE_THREAD_LOCAL, CAPTURE_MODE_RELAXED = 0, 1, 2
#: cudaStreamNonBlocking (driver_types.h): no implicit order with the legacy default stream
STREAM_NON_BLOCKING = 1


@functools.lru_cache(maxsize=None)
def _cudart_function(name: str, argtypes: tuple = ()):
    """The function ``name`` of the CUDA runtime library this process loaded (torch's: the
    same runtime, so its streams and the current device are torch's), returning an int status;
    None where none is loaded (a CPU build)."""
    import ctypes

    candidates = [None]
    try:
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps if "libcudart" in line})
    except OSError:
        pass
    for library in candidates:
        try:
            function = getattr(ctypes.CDLL(library), name)
        except (OSError, AttributeError):
            continue
        function.argtypes = list(argtypes)
        function.restype = ctypes.c_int
        return function
    return None


def _capture_mode_exchange():
    """``cudaThreadExchangeStreamCaptureMode`` of torch's CUDA runtime, or None (a CPU build)."""
    import ctypes

    return _cudart_function("cudaThreadExchangeStreamCaptureMode", (ctypes.POINTER(ctypes.c_int),))


# -- what a launch touches, and the emulator's deferral ----------------------------------------
def _tensors(value, into: list) -> None:
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, into)


class _Recording(TorchDispatchMode):
    """Runs every operation as it comes; appends each tensor it reads or writes to ``touched``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would wrap ``__torch_dispatch__`` in ``_disable_dynamo``, which imports
        dynamo at the mode's first use (seconds, inside a collective; and the import's own torch
        operations would meet the mode). This mode never runs under torch.compile."""
        return False

    def __init__(self, touched: list):
        super().__init__()
        self.touched = touched

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _tensors(args, self.touched)
        _tensors(list(kwargs.values()), self.touched)
        return self.run(func, args, kwargs)

    def run(self, func, args, kwargs):
        return func(*args, **kwargs)


def _written(func, args, kwargs):
    """The tensors ``func`` writes (its schema's ``Tensor(a!)`` arguments), or None when it
    writes none."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is not None and info.is_write:
            written.append(args[position] if position < len(args) else kwargs.get(argument.name))
    return written or None


class _Deferring(_Recording):
    """The emulator's device: operations that read or write tensor data are put on the stream
    being launched on (run there, in order, on the stream's thread); views, allocations and
    in-place metadata changes run now; an operation that neither writes its arguments nor is
    one of those (``item()``, an out-of-place result the host would read) first waits for the
    stream, then runs now."""

    #: host-side operations: they allocate, or change no data
    NOW = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
           torch.ops.aten.empty_like.default, torch.ops.aten.new_empty.default,
           torch.ops.aten.new_empty_strided.default, torch.ops.aten._unsafe_view.default}

    def __init__(self, put: Callable, synchronize: Callable, touched: list, allocator=None):
        super().__init__(touched)
        self.put, self.synchronize, self.allocator = put, synchronize, allocator

    def run(self, func, args, kwargs):
        if func.is_view or func in self.NOW or torch.Tag.inplace_view in func.tags:
            return func(*args, **kwargs)
        written = _written(func, args, kwargs)
        if written is None:
            self.synchronize()
            return func(*args, **kwargs)
        if self.allocator is not None:    # the device holds memory, not tensors
            args, kwargs = self.allocator.raw(args), dict(zip(kwargs, self.allocator.raw(list(kwargs.values()))))
        self.put(lambda: func(*args, **kwargs))
        returns = len(func._schema.returns)
        return None if returns == 0 else written[0] if returns == 1 else tuple(written)


#: the emulator's launch in progress on this thread (its ``put``), for :func:`device_work`
_launching = threading.local()


def device_work(fn: Callable[[], None]) -> None:
    """Device work that is not a torch operation (an emulated NCCL batch, a CPU kernel of
    numba's): put on the stream the calling thread is launching on (the emulator's
    :meth:`EmulatedRuntime.launch`), else run now."""
    put = getattr(_launching, "put", None)
    if put is None:
        fn()
    else:
        put(fn)


# -- the emulator ----------------------------------------------------------------------------
class EmulatedEvent:
    #: names of the threads events were destroyed on (tests: never the watchdog's)
    destroyed_on: list = []

    __slots__ = ("_done", "stream", "__weakref__")

    def __init__(self, stream):
        self._done = threading.Event()
        self.stream = stream

    def query(self) -> bool:
        return self._done.is_set()

    def __del__(self):
        EmulatedEvent.destroyed_on.append(threading.current_thread().name)


class EmulatedStream:
    """A FIFO of work run by one thread, in enqueue order. A function that raises does not
    stop the stream (as a failed kernel does not stop a CUDA stream): the error is kept in
    :attr:`errors` and the next functions run."""

    def __init__(self, name: str, device: torch.device):
        self.name, self.device = name, device
        self.errors: list = []
        self._work: "queue.Queue[Callable[[], None]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"ringcoll-stream-{name}", daemon=True)
        self._thread.start()

    def put(self, fn: Callable[[], None]) -> None:
        self._work.put(fn)

    def _run(self) -> None:
        torch.set_grad_enabled(False)   # a device stream records no autograd
        while True:
            fn = self._work.get()
            try:
                fn()
            except BaseException as error:  # noqa: BLE001 - kept, the stream goes on
                self.errors.append(error)

    def __repr__(self) -> str:
        return f"EmulatedStream({self.name})"


class ReusingAllocator:
    """The emulator's stand-in for CUDA's caching allocator, at its most unforgiving: the memory
    of a tensor whose storage is freed goes straight back to the next allocation of its size.
    Under an emulated launch, device work holds such a tensor by its memory only (a non-owning
    alias, as a kernel holds a pointer), so a tensor the host drops while a call still uses it
    is reused and overwritten unless the call keeps it. Tensors come from :meth:`empty`. As
    in CUDA's, an allocation is for the calling thread's current stream (the process emulator's),
    and a freed block goes back to that stream's pool and serves only later allocations for it
    (so in-process ranks, each on its own stream, never trade blocks: which rank got which would
    depend on the threads' timing)."""

    ALIGN = 64

    def __init__(self, nbytes: int = 1 << 24):
        import numpy as np

        self.arena = np.zeros(nbytes, dtype=np.uint8)
        self.whole = torch.from_numpy(self.arena)     # owns the arena, not the blocks
        self.base, self.nbytes = self.whole.data_ptr(), nbytes
        self._free: dict = {}
        self._top = 0
        self._lock = threading.Lock()

    def empty(self, *size: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        numel = 1
        for n in size:
            numel *= n
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(-(-numel * itemsize // self.ALIGN) * self.ALIGN, self.ALIGN)
        pool = (emulated().current(self.whole.device), nbytes)
        with self._lock:
            blocks = self._free.get(pool)
            if blocks:
                offset = blocks.pop()
            else:
                offset, self._top = self._top, self._top + nbytes
                if self._top > self.nbytes:
                    raise MemoryError("the emulated allocator's arena is full")
        block = self.arena[offset:offset + nbytes]
        weakref.finalize(block, self._release, pool, offset)   # when the storage dies
        return torch.from_numpy(block).view(dtype)[:numel].view(size)

    def _release(self, pool: tuple, offset: int) -> None:
        with self._lock:
            self._free.setdefault(pool, []).append(offset)

    def raw(self, values):
        """``values`` (a tuple or list, nested) with each tensor of this allocator's replaced by
        a non-owning alias of its memory."""
        out = []
        for value in values:
            if isinstance(value, torch.Tensor) and self.base <= value.data_ptr() < self.base + self.nbytes:
                start = value.untyped_storage().data_ptr() - self.base
                value = self.whole.view(value.dtype).as_strided(
                    value.size(), value.stride(), start // value.element_size() + value.storage_offset())
            elif isinstance(value, (list, tuple)):
                value = self.raw(value)
            out.append(value)
        return type(values)(out) if isinstance(values, tuple) else out


class EmulatedRuntime(StreamRuntime):
    """CUDA's stream semantics on the CPU (see the module docstring). Each thread has a
    current stream per device (the device's default stream unless :meth:`use` says
    otherwise). It has no stream-aware futures: a call's future completes on the host once
    the watchdog has seen the call end, so a callback runs only once the data is there."""

    def __init__(self):
        super().__init__()
        self._defaults: dict = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._count = 0
        self.capture = False            # tests: pretend the current stream is capturing
        #: tests: a graph captured on some thread in the global mode, as CUDA's: a query from
        #: a thread whose capture mode is not relaxed then fails (and would invalidate it)
        self.global_capture = False
        #: tests: a :class:`ReusingAllocator` whose tensors the device work holds by their memory
        #: only, as a GPU's kernels do (None: device work holds the tensors themselves)
        self.allocator: Optional[ReusingAllocator] = None

    def _default(self, device):
        key = (device.type, device.index)
        with self._lock:
            stream = self._defaults.get(key)
            if stream is None:
                stream = self._defaults[key] = EmulatedStream(f"default-{device}", device)
        return stream

    def current(self, device):
        current = getattr(self._local, "streams", {}).get((device.type, device.index))
        return current if current is not None else self._default(device)

    @contextlib.contextmanager
    def use(self, stream):
        """Make ``stream`` the calling thread's current stream on its device."""
        streams = self._local.__dict__.setdefault("streams", {})
        key = (stream.device.type, stream.device.index)
        saved = streams.get(key)
        streams[key] = stream
        try:
            yield stream
        finally:
            streams[key] = saved

    def _create_stream(self, device):
        with self._lock:
            self._count += 1
            return EmulatedStream(f"{device}-{self._count}", device)

    def launch(self, stream, fn, on_error=None, touched=None):
        """CUDA's split: ``fn`` runs now on the calling thread under :class:`_Deferring`, which
        puts every operation that reads or writes tensor data (and every kernel launch and
        batch: :func:`device_work`) on ``stream``, in order; views and allocations happen
        now, as a GPU's host does them; an operation whose result the host reads (``item()``)
        first waits for the stream, as CUDA's synchronising calls do."""

        def put(work):
            def run():
                try:
                    work()
                except BaseException as error:
                    if on_error is None:
                        raise
                    on_error(error)
            stream.put(run)

        outer = getattr(_launching, "put", None), getattr(kernels.device_work, "put", None)
        _launching.put = kernels.device_work.put = put
        try:
            with _Deferring(put, lambda: self.synchronize(self.record(stream)),
                            touched if touched is not None else [], self.allocator):
                fn()
        finally:
            _launching.put, kernels.device_work.put = outer

    def record(self, stream):
        event = self._reused_event()
        if event is None:
            event = EmulatedEvent(stream)
        else:
            event._done.clear()
            event.stream = stream
        stream.put(event._done.set)
        return event

    @contextlib.contextmanager
    def watching(self, device):
        saved = getattr(self._local, "relaxed", False)
        self._local.relaxed = True
        try:
            yield
        finally:
            self._local.relaxed = saved

    def wait(self, stream, event):
        if stream is not event.stream:
            stream.put(event._done.wait)

    def query(self, event):
        if self.global_capture and not getattr(self._local, "relaxed", False):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing "
                               "(cudaEventQuery from another thread during a global-mode capture)")
        return event.query()

    def synchronize(self, event):
        StreamRuntime.host_waits += 1
        event._done.wait()

    def capturing(self, device):
        return self.capture

    #: whether the emulator's CPU tensors stand for device memory, which the host reads only
    #: after a synchronisation (tests of CUDA's semantics set it: a synchronous call then
    #: returns once enqueued, ``wait()`` only orders the waiting stream); False, the default
    #: (``RINGCOLL_TRANSPORT=streamed``): they are CPU memory, which the caller reads at once
    device_memory = False

    def host_reads(self, device):
        return not self.device_memory


@functools.lru_cache(maxsize=None)
def cuda() -> CudaRuntime:
    """The process's CUDA runtime."""
    return CudaRuntime()


@functools.lru_cache(maxsize=None)
def emulated() -> EmulatedRuntime:
    """The process's emulator (one, so that a test's streams and ringcoll's share it)."""
    return EmulatedRuntime()
