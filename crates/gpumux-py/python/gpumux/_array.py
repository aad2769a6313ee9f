"""`ndarray`: a C-contiguous array in a gpumuxd client's device memory,
with NumPy's shapes and dtypes, and the functions that make and read one."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._client import Client, Stream, current_client

Shape = Union[int, Sequence[int]]
# `progress`: False, True (a line on stderr), or a function of (bytes done, bytes in all).
Progress = Union[bool, Callable[[int, int], None]]

# A copy asked to show progress goes in pieces of this size.
PROGRESS_CHUNK = 64 << 20


def _shape(shape: Shape) -> Tuple[int, ...]:
    t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in t):
        raise ValueError(f"negative dimensions are not allowed: {t}")
    return t


class ndarray:
    """An array on the device of a gpumux client (C-contiguous).

    `ndarray(shape, dtype)` allocates (uninitialised), as CuPy's does; the
    usual ways in are `gpumux.asarray(numpy_array)`, `zeros` and `empty`, the
    way out `a.get()` or `gpumux.asnumpy(a)`. The memory is freed when the
    array (and every view of it) is collected, or at once by `free()`."""

    __slots__ = ("client", "shape", "dtype", "_mem", "_offset", "__weakref__")

    def __init__(self, shape: Shape, dtype: Any = float, *, client: Optional[Client] = None) -> None:
        self.client = client if client is not None else current_client()
        self.shape = _shape(shape)
        self.dtype = np.dtype(dtype)
        if self.dtype.hasobject:
            raise TypeError("an array of Python objects cannot live on the device")
        self._offset = 0
        # An empty array has no memory (the daemon allocates no empty buffer).
        self._mem: Optional[_native.Memory] = self.client._native.alloc(self.nbytes) if self.nbytes else None

    @classmethod
    def _view(cls, base: "ndarray", shape: Tuple[int, ...], dtype: np.dtype, offset: int) -> "ndarray":
        v = cls.__new__(cls)
        v.client, v.shape, v.dtype, v._mem, v._offset = base.client, shape, dtype, base._mem, offset
        return v

    # NumPy's attributes.
    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        return self.size * int(self.dtype.itemsize)

    @property
    def strides(self) -> Tuple[int, ...]:
        strides, step = [], self.dtype.itemsize
        for s in reversed(self.shape):
            strides.append(step)
            step *= max(s, 1)
        return tuple(reversed(strides))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    # Where it lives.
    @property
    def device(self) -> str:
        """The device it is on, with the client: `sim:h100, client 3`."""
        return f"{self.client.device}, client {self.client.id}"

    @property
    def handle(self) -> Optional[int]:
        """The daemon's handle of its memory (what `ContextLost.buffers` lists); None if empty."""
        return None if self._mem is None else self._mem.handle

    @property
    def __gpumux_arg__(self) -> Any:
        """What a kernel launch passes for it: a pointer to its first element."""
        if self._mem is None or self._offset == 0:
            return self._mem
        return (self._mem, self._offset)

    # Copies.
    def get(self, stream: Optional[Stream] = None, out: Optional[np.ndarray] = None, *,
            progress: Progress = False) -> np.ndarray:
        """A NumPy copy (waits for the work queued before it on `stream`, the
        current stream by default). `out`: a C-contiguous array of the same
        shape and dtype to copy into. `progress`: see `asarray`."""
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape {self.shape}, "
                             f"not {out.dtype} {out.shape}")
        self._host_copy(out, stream, progress, to_device=False)
        return out

    def set(self, a: Any, stream: Optional[Stream] = None, *, progress: Progress = False) -> None:
        """Copies host data `a` (of this shape; cast to this dtype) into it."""
        src = np.asarray(a, dtype=self.dtype, order="C")
        if src.shape != self.shape:
            raise ValueError(f"cannot copy an array of shape {src.shape} into one of shape {self.shape}")
        self._host_copy(src, stream, progress, to_device=True)

    def _host_copy(self, host: np.ndarray, stream: Optional[Stream], progress: Progress, *, to_device: bool) -> None:
        """Copies between `host` (C-contiguous, this array's size, alive for
        the call: the native call reads or writes its bytes by address) and
        this array."""
        if not self.nbytes:
            return
        sid = self.client._stream_id(stream)
        address = host.__array_interface__["data"][0]
        copy = self.client._native.copy_host
        _chunked(self.nbytes, progress, "to the device" if to_device else "to the host",
                 lambda at, n: copy(self._live(), self._offset + at, address + at, n, sid, to_device))

    def copy(self, stream: Optional[Stream] = None) -> "ndarray":
        """A new device array with the same contents (copied on the device)."""
        out = ndarray(self.shape, self.dtype, client=self.client)
        if self.nbytes:
            self.client._native.copy_device(self._live(), self._offset, out._live(), 0, self.nbytes,
                                            self.client._stream_id(stream))
        return out

    def _memset(self, value: int, stream: Optional[Stream]) -> None:
        if self.nbytes:
            self.client._native.memset(self._live(), self._offset, value, self.nbytes, self.client._stream_id(stream))

    def _live(self) -> _native.Memory:
        assert self._mem is not None  # every caller checks nbytes first
        return self._mem

    # Views (sharing the memory).
    def reshape(self, *shape: Any) -> "ndarray":
        """The same memory with another shape (one dimension may be -1)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        dims = [int(s) for s in shape]
        if dims.count(-1) > 1:
            raise ValueError("can only specify one unknown dimension")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            dims[dims.index(-1)] = self.size // known if known else 0
        if math.prod(dims) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {tuple(shape)}")
        return ndarray._view(self, tuple(dims), self.dtype, self._offset)

    def ravel(self) -> "ndarray":
        return self.reshape(-1)

    def view(self, dtype: Any) -> "ndarray":
        """The same bytes as another dtype (the last dimension rescaled)."""
        dt = np.dtype(dtype)
        last = self.shape[-1] * self.itemsize if self.shape else self.itemsize
        if last % dt.itemsize:
            raise ValueError(f"the last dimension ({last} bytes) is not a multiple of {dt}'s {dt.itemsize} bytes")
        shape = self.shape[:-1] + (last // dt.itemsize,) if self.shape else (last // dt.itemsize,)
        return ndarray._view(self, shape, dt, self._offset)

    def __getitem__(self, key: Any) -> "ndarray":
        """Contiguous pieces only: an index or a slice of step 1 along the first axis."""
        if not self.shape:
            raise IndexError("a 0-d array cannot be indexed")
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"index {key} is out of bounds for axis 0 with size {self.shape[0]}")
            return ndarray._view(self, self.shape[1:], self.dtype, self._offset + i * row)
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("gpumux arrays take slices of step 1 only (a view must be contiguous)")
            n = max(stop - start, 0)
            return ndarray._view(self, (n,) + self.shape[1:], self.dtype, self._offset + start * row)
        raise IndexError("gpumux arrays take an int or a slice along the first axis (a view must be contiguous)")

    # Lifetime.
    def free(self) -> None:
        """Frees its memory now (after the work queued before), for every view of it too."""
        if self._mem is not None:
            self._mem.free()

    @property
    def freed(self) -> bool:
        return self._mem is not None and self._mem.freed

    # Printing, as NumPy does, plus where it lives.
    def __repr__(self) -> str:
        if self.freed or self.client.closed:
            state = "freed" if self.freed else "of a closed client"
            return f"<gpumux.ndarray {state}, shape={self.shape}, dtype={self.dtype}>"
        # NumPy's own repr, with where it lives before the closing parenthesis.
        return f"{repr(self.get())[:-1]}, device='{self.device}')"

    def __str__(self) -> str:
        return repr(self) if self.freed or self.client.closed else str(self.get())

    # NumPy conversion is explicit, as in CuPy: a hidden copy per call is a trap.
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("implicit conversion of a gpumux array to NumPy is not allowed: use .get() "
                        "or gpumux.asnumpy() (the copy is explicit, as in CuPy)")


def _chunked(total: int, progress: Progress, what: str, copy: Callable[[int, int], None]) -> None:
    """`copy(offset, nbytes)` over `[0, total)`: in one call, or in pieces
    reporting progress when asked (a call per piece costs a request each)."""
    if not progress:
        copy(0, total)
        return
    report = progress if callable(progress) else _stderr_progress(what)
    done = 0
    while done < total:
        n = min(PROGRESS_CHUNK, total - done)
        copy(done, n)
        done += n
        report(done, total)


def _stderr_progress(what: str) -> Callable[[int, int], None]:
    start = time.perf_counter()

    def report(done: int, total: int) -> None:
        secs = max(time.perf_counter() - start, 1e-9)
        end = "\n" if done == total else ""
        sys.stderr.write(f"\rgpumux: copied {done >> 20}/{total >> 20} MiB {what} "
                         f"({done / secs / 1e9:.2f} GB/s){end}")
        sys.stderr.flush()

    return report


def _asarray(client: Client, a: Any, dtype: Any, stream: Optional[Stream], progress: Progress) -> ndarray:
    if isinstance(a, ndarray):
        if a.client is not client:
            raise ValueError("the array belongs to another gpumux client (copy it through the host: a.get())")
        return a if dtype is None or np.dtype(dtype) == a.dtype else _asarray(client, a.get(), dtype, stream, progress)
    host = np.asarray(a, dtype=dtype, order="C")  # keeps 0-d arrays 0-d, unlike ascontiguousarray
    out = ndarray(host.shape, host.dtype, client=client)
    out.set(host, stream, progress=progress)
    return out


# The module-level functions, on the current client.
def asarray(a: Any, dtype: Any = None, *, stream: Optional[Stream] = None, progress: Progress = False) -> ndarray:
    """`a` (a NumPy array, or anything `numpy.asarray` takes) copied to the
    device of the current client. A gpumux array of that client comes back as
    it is. `progress=True` prints the copy's progress on stderr (a function
    of (bytes done, bytes in all) is called instead)."""
    return _asarray(current_client(), a, dtype, stream, progress)


def asnumpy(a: Any, stream: Optional[Stream] = None, *, progress: Progress = False) -> np.ndarray:
    """A NumPy copy of a gpumux array (anything else goes through `numpy.asarray`)."""
    if isinstance(a, ndarray):
        return a.get(stream, progress=progress)
    return np.asarray(a)


def empty(shape: Shape, dtype: Any = float) -> ndarray:
    """An uninitialised array on the current client's device."""
    return ndarray(shape, dtype)


def zeros(shape: Shape, dtype: Any = float) -> ndarray:
    """An array of zero bytes (a memset on the device)."""
    return current_client().zeros(shape, dtype)
