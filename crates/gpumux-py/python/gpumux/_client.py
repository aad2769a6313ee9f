"""`Client`: one connection to gpumuxd; `Stream`, `Event`, `Module`,
`Kernel`; which client and stream calls use when none is given."""

from __future__ import annotations

import contextvars
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _native
from .notices import Notice
from .notices import _from_native as _notice

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, DTypeLike

    from ._array import ndarray

Dim3 = Union[int, Tuple[int], Tuple[int, int], Tuple[int, int, int]]

# The client a `with client:` block made current (per thread and task) ...
_current: contextvars.ContextVar[Optional["Client"]] = contextvars.ContextVar("gpumux_client", default=None)
# ... else the process's default client: the first one `connect()` made, or
# one connected on first use (honouring GPUMUX_SOCKET).
_default: Optional["Client"] = None
_default_lock = threading.Lock()
# The stream a `with stream:` block made current.
_current_stream: contextvars.ContextVar[Optional["Stream"]] = contextvars.ContextVar("gpumux_stream", default=None)


def connect(
    socket: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    name: Optional[str] = None,
    priority: int = 0,
    weight: float = 1.0,
    wait: Optional[float] = None,
) -> "Client":
    """Connects to gpumuxd. `socket`: the daemon's socket, else
    `$GPUMUX_SOCKET`, else the default path (`$XDG_RUNTIME_DIR/gpumux.sock` or
    `/run/gpumux/gpumux.sock`). `name` shows in `gpumux ps` (default: the
    program's name); `priority` (larger is more urgent, up to the config's
    limit) and `weight` (share under proportional policies) can be changed
    later. `wait`: seconds to wait for a daemon that is starting (default
    `$GPUMUX_CONNECT_WAIT_MS`, else 2).

    The first client connected becomes the process's default, which
    `gpumux.asarray()` and friends use outside a `with client:` block."""
    global _default
    client = Client(socket, name=name, priority=priority, weight=weight, wait=wait)
    with _default_lock:
        if _default is None or _default.closed:
            _default = client
    return client


def current_client() -> "Client":
    """The client of the innermost `with client:` block, else the default
    client (connected now if there is none yet)."""
    global _default
    client = _current.get()
    if client is not None:
        return client
    default = _default  # without the lock first: every RawKernel launch asks
    if default is not None and not default.closed:
        return default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Client()
        return _default


def _forget_default_on(socket: str) -> None:
    """Closes the default client if it is connected to `socket` (a daemon
    `gpumux.sim` is stopping), so the next implicit use connects anew."""
    global _default
    with _default_lock:
        if _default is not None and _default.socket == socket:
            _default.close()
            _default = None


class Client:
    """A connection to gpumuxd (see `connect`). Use it as a context manager to
    make it current for `gpumux.asarray()` and friends, and close it at the end.
    Closing (or the process ending) frees everything it holds on the daemon."""

    def __init__(
        self,
        socket: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        name: Optional[str] = None,
        priority: int = 0,
        weight: float = 1.0,
        wait: Optional[float] = None,
    ) -> None:
        wait_ms = None if wait is None else int(wait * 1000)
        self._native = _native.Client(
            None if socket is None else os.fspath(socket), name, int(priority), float(weight), wait_ms
        )
        self._priority = int(priority)
        self._weight = float(weight)
        self._token: List[contextvars.Token[Optional[Client]]] = []
        self.default_stream = Stream._default(self)
        # Its live streams, for `synchronize_all`.
        self._streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()

    # What the daemon said at the handshake.
    @property
    def device(self) -> str:
        """The device, in words: `sim:h100`, `NVIDIA H100 80GB HBM3 (cuda:0)`."""
        return self._native.device

    @property
    def policy(self) -> str:
        return self._native.policy

    @property
    def sms(self) -> int:
        return self._native.sms

    @property
    def id(self) -> int:
        """This client's number in `gpumux ps`."""
        return self._native.client_id

    @property
    def socket(self) -> str:
        return self._native.socket

    @property
    def is_simulated(self) -> bool:
        """Whether the device is simulated: kernels take their time there but compute nothing."""
        return self._native.is_simulated

    @property
    def limits(self) -> Dict[str, Any]:
        """This client's limits from the daemon's config (memory_bytes, max_priority, ...)."""
        return self._native.limits

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def priority(self) -> int:
        """Larger is more urgent. Settable (from the daemon's next scheduling round)."""
        return self._priority

    @priority.setter
    def priority(self, value: int) -> None:
        self._native.set_priority(int(value))
        self._priority = int(value)

    @property
    def weight(self) -> float:
        """Share under the proportional policies. Settable."""
        return self._weight

    @weight.setter
    def weight(self, value: float) -> None:
        self._native.set_weight(float(value))
        self._weight = float(value)

    # Arrays.
    def asarray(self, a: "ArrayLike", dtype: Optional["DTypeLike"] = None, *, stream: Optional["Stream"] = None,
                progress: Any = False) -> "ndarray":
        """`a` (a NumPy array or anything NumPy takes) copied to the device."""
        from ._array import _asarray

        return _asarray(self, a, dtype, stream, progress)

    def empty(self, shape: Union[int, Sequence[int]], dtype: "DTypeLike" = float) -> "ndarray":
        from ._array import ndarray

        return ndarray(shape, dtype, client=self)

    def zeros(self, shape: Union[int, Sequence[int]], dtype: "DTypeLike" = float, *,
              stream: Optional["Stream"] = None) -> "ndarray":
        a = self.empty(shape, dtype)
        a._memset(0, stream)
        return a

    # Kernels.
    def compile(self, source: str, options: Iterable[str] = (), *, name: str = "module.cu") -> "Module":
        """Compiles CUDA C `source` (NVRTC `options`) on the daemon."""
        return Module(self, self._native.load_module(name, source, list(options)))

    def launch(self, kernel: "Kernel", grid: Dim3, block: Dim3, args: Sequence[Any], *, shared_mem: int = 0,
               stream: Optional["Stream"] = None, sim_block_ns: Optional[int] = None) -> None:
        """Queues `kernel` on `stream` (default: the current stream). Errors the
        daemon finds come at the next `synchronize()` (as CUDA's do)."""
        self._native.launch(kernel._native, grid, block, args, shared_mem, self._stream_id(stream), sim_block_ns)

    # Streams.
    def stream(self) -> "Stream":
        """A new stream, independent of the others."""
        return Stream(self)

    @property
    def current_stream(self) -> "Stream":
        """The stream of the innermost `with stream:` block of this client, else its default stream."""
        s = _current_stream.get()
        return s if s is not None and s.client is self else self.default_stream

    def _stream_id(self, stream: Optional["Stream"]) -> int:
        if stream is None:
            s = _current_stream.get()
            return s._id if s is not None and s.client is self else 0
        if stream.client is not self:
            raise ValueError("the stream belongs to another gpumux client")
        return stream._id

    def synchronize(self, stream: Optional["Stream"] = None) -> None:
        """Waits for the work queued on `stream` (default: the current stream)."""
        if stream is None:
            s = _current_stream.get()
            self._native.sync(s._id if s is not None and s.client is self else 0)
        else:
            self._native.sync(self._stream_id(stream))

    def synchronize_all(self) -> None:
        """Waits for the work queued on every stream of this client."""
        self._native.sync(0)
        for s in list(self._streams):
            if s._id:
                s.synchronize()

    # State.
    def status(self) -> Dict[str, Any]:
        """The daemon's table of clients, what `gpumux ps` shows."""
        return self._native.status()

    def memory_used(self) -> int:
        """Device memory this client holds, bytes, as the daemon counts it."""
        for row in self.status()["clients"]:
            if row["client"] == self.id:
                return int(row["memory_used"])
        raise RuntimeError(f"the daemon's status has no row for this client ({self.id})")

    def notices(self) -> List[Notice]:
        """What the daemon said unasked since the last call: `ContextLost`
        (with this client's lost launches, copies and buffers) or `ShuttingDown`."""
        return [_notice(t) for t in self._native.take_notices()]

    def close(self) -> None:
        """Says goodbye: the daemon drops this client's queued work and frees
        its memory. Arrays of a closed client cannot be used."""
        self._native.close()

    def __enter__(self) -> "Client":
        self._token.append(_current.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token.pop())
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"client {self.id}"
        return f"<gpumux.Client {state} on {self.device} at {self.socket}>"


class Stream:
    """An ordered queue of work on the device. `with stream:` makes it current,
    so launches and copies of its client go on it. Destroyed by `close()` or
    when collected (after its queued work)."""

    def __init__(self, client: Optional[Client] = None) -> None:
        self.client = client if client is not None else current_client()
        self._id = self.client._native.create_stream()
        self._tokens: List[contextvars.Token[Optional[Stream]]] = []
        self.client._streams.add(self)

    @classmethod
    def _default(cls, client: Client) -> "Stream":
        s = cls.__new__(cls)
        s.client, s._id, s._tokens = client, 0, []
        return s

    @property
    def id(self) -> int:
        return self._id

    def synchronize(self) -> None:
        """Waits until the work queued on it before now is done."""
        self.client._native.sync(self._id)

    def record(self) -> "Event":
        """An event at this point of the stream."""
        return Event(self)

    def close(self) -> None:
        if self._id != 0 and not self.client.closed:
            self.client._native.destroy_stream(self._id)
        self._id = 0

    def __enter__(self) -> "Stream":
        self._tokens.append(_current_stream.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _current_stream.reset(self._tokens.pop())

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a destructor has nobody to raise to
            pass

    def __repr__(self) -> str:
        return f"<gpumux.Stream {self._id} of client {self.client.id}>"


class Event:
    """A point of a stream (`stream.record()`). `with stream.record() as e:`
    lets the host work while the device gets there, and waits for it at the
    end of the block."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._id: Optional[int] = stream.client._native.record_event(stream._id)

    @property
    def done(self) -> bool:
        """Whether the device has reached it (never waits)."""
        return self.stream.client._native.query_event(self._live())

    def synchronize(self) -> None:
        """Waits until the device has reached it."""
        self.stream.client._native.wait_event(self._live())

    def _live(self) -> int:
        if self._id is None:
            raise ValueError("the event was closed")
        return self._id

    def close(self) -> None:
        event, self._id = self._id, None
        client = self.stream.client
        if event is not None and not client.closed:
            client._native.destroy_event(event)

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.synchronize()
        finally:
            self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a destructor has nobody to raise to
            pass


class Module:
    """CUDA C compiled on the daemon (`Client.compile`)."""

    def __init__(self, client: Client, native: "_native.Module") -> None:
        self.client = client
        self._native = native

    @property
    def kernels(self) -> List[str]:
        return self._native.kernels

    @property
    def log(self) -> str:
        """The compiler's warnings, if any."""
        return self._native.log

    @property
    def cached(self) -> bool:
        """Whether the daemon had compiled the same source and options before."""
        return self._native.cached

    def kernel(self, name: str) -> "Kernel":
        """Its kernel `name` (`NoSuchKernel`, listing the module's kernels, if none)."""
        return Kernel(self.client, self._native.kernel(name))


class Kernel:
    """A kernel of a module. `kernel(grid, block, args, shared_mem=0)` launches
    it as CuPy's `RawKernel` does; `sim_block_ns` is how long one block takes
    on a simulated device (which computes nothing; default 10 µs)."""

    def __init__(self, client: Client, native: "_native.Kernel") -> None:
        self.client = client
        self._native = native
        self.sim_block_ns: Optional[int] = None

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def param_sizes(self) -> Optional[List[int]]:
        """Its parameters' sizes in bytes, where the daemon knows them (then
        arguments of other sizes are refused before they are sent)."""
        return self._native.param_sizes

    def __call__(self, grid: Dim3, block: Dim3, args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Optional[Stream] = None) -> None:
        # The hot path of a Python program (issue 41: launch + sync within 3 µs
        # of Rust's): the stream looked up inline, grid and block converted
        # by the extension.
        c = self.client
        if stream is None:
            s = _current_stream.get()
            sid = s._id if s is not None and s.client is c else 0
        else:
            sid = c._stream_id(stream)
        c._native.launch(self._native, grid, block, args, shared_mem, sid, self.sim_block_ns)

    def __repr__(self) -> str:
        return f"<gpumux.Kernel {self.name}>"
