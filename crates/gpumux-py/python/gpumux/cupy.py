"""CuPy's custom-kernel API over gpumuxd: a program that uses only what is
here runs through the daemon when its `import cupy as cp` becomes
`import gpumux.cupy as cp`.

Covered: `RawKernel(code, name, options=(), backend='nvrtc')` called as
`k(grid, block, args, shared_mem=0)`; `RawModule(code=..., options=...)`
with `get_function(name)`; `asarray`, `asnumpy`, `zeros`, `empty`, `ones`,
`full`, `arange`, `zeros_like`, `empty_like`, `ndarray` (`get()`, `set()`,
`shape`, `dtype`, `nbytes`, `reshape`, `copy`); `cuda.Stream` (as a context
manager, `synchronize()`), `cuda.Device().synchronize()`, and NumPy's scalar
types (`cp.float32`, ...). Not covered: CuPy's array arithmetic and ufuncs,
`ElementwiseKernel`/`ReductionKernel`, kernels from PTX or cubin files,
C++ template kernels by `name_expressions`, Jitify. docs/python.md says more.

Kernel arguments follow CuPy's rules: arrays by pointer, NumPy scalars as
their dtype, a Python int as int64 and a float as float64. Where the daemon
knows the kernel's parameter sizes, a wrong-sized argument is refused
(`gpumux.InvalidArgument`) instead of read as garbage.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as _np

from ._array import Shape, ndarray
from ._array import asarray as _asarray
from ._array import asnumpy as _asnumpy
from ._client import Dim3, Kernel
from ._client import Stream as _Stream
from ._client import current_client

# NumPy's scalar types, as CuPy exports them.
from numpy import (  # noqa: F401
    bool_, complex64, complex128, float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32,
    uint64,
)

__all__ = [
    "RawKernel", "RawModule", "asarray", "asnumpy", "zeros", "empty", "ones", "full", "arange", "zeros_like",
    "empty_like", "ndarray", "cuda", "is_simulated",
    "bool_", "complex64", "complex128", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64",
]


def _check_backend(backend: str, jitify: bool) -> None:
    if backend != "nvrtc":
        raise ValueError(f"backend {backend!r}: gpumuxd compiles with NVRTC only (backend='nvrtc')")
    if jitify:
        raise NotImplementedError("jitify=True: gpumuxd compiles plain CUDA C with NVRTC, without Jitify")


class RawKernel:
    """A kernel from CUDA C source, compiled on the daemon at first use, as
    CuPy's `RawKernel` compiles at first call. The kernel must be declared
    `extern "C"` (as with CuPy, unless you know its mangled name)."""

    def __init__(self, code: str, name: str, options: Sequence[str] = (), backend: str = "nvrtc", *,
                 translate_cucomplex: bool = False, enable_cooperative_groups: bool = False,
                 jitify: bool = False) -> None:
        _check_backend(backend, jitify)
        if enable_cooperative_groups:
            raise NotImplementedError("cooperative groups: gpumux runs kernels as preemptible workers, "
                                      "which cannot grid-synchronise")
        self.code, self.name, self.options, self.backend = code, name, tuple(options), backend
        self._module: Optional[RawModule] = None
        self._kernel: Optional[Kernel] = None

    @property
    def kernel(self) -> Kernel:
        """The compiled kernel, on the current client (compiled there now if it
        was not: the daemon keeps compiled modules, so a second client's
        compile of the same source is a lookup)."""
        if self._kernel is None or self._kernel.client is not current_client():
            self._module = RawModule(code=self.code, options=self.options)
            self._kernel = self._module.get_function(self.name).kernel
        return self._kernel

    def compile(self) -> None:
        """Compiles now (CuPy's `RawKernel.compile`)."""
        self.kernel  # noqa: B018

    def __call__(self, grid: Dim3, block: Dim3, args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Optional[_Stream] = None) -> None:
        self.kernel(grid, block, args, shared_mem=shared_mem, stream=stream)


class _Function:
    """A kernel of a `RawModule` (CuPy's `cupy.cuda.Function`)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    @property
    def name(self) -> str:
        return self.kernel.name

    def __call__(self, grid: Dim3, block: Dim3, args: Sequence[Any], *, shared_mem: int = 0,
                 stream: Optional[_Stream] = None) -> None:
        self.kernel(grid, block, args, shared_mem=shared_mem, stream=stream)


class RawModule:
    """A module from CUDA C source (`code=`), compiled on the daemon at
    construction. `path=` (PTX or cubin) is not supported: gpumuxd
    transforms kernels from their source to make them preemptible."""

    def __init__(self, *, code: Optional[str] = None, path: Optional[str] = None, options: Sequence[str] = (),
                 backend: str = "nvrtc", translate_cucomplex: bool = False,
                 enable_cooperative_groups: bool = False, name_expressions: Optional[Sequence[str]] = None,
                 jitify: bool = False) -> None:
        _check_backend(backend, jitify)
        if path is not None or code is None:
            raise NotImplementedError("RawModule needs code=: gpumuxd compiles kernels from CUDA C source "
                                      "(it transforms them), not from PTX or cubin files")
        if name_expressions:
            raise NotImplementedError("name_expressions (C++ template kernels): declare the kernels "
                                      "extern \"C\" and get them by name")
        if enable_cooperative_groups:
            raise NotImplementedError("cooperative groups: gpumux's preemptible workers cannot grid-synchronise")
        self.code, self.options = code, tuple(options)
        self.module = current_client().compile(code, self.options, name="raw_module.cu")

    def get_function(self, name: str) -> _Function:
        """Its kernel `name` (`gpumux.NoSuchKernel`, a KeyError listing its kernels, if none)."""
        return _Function(self.module.kernel(name))


def asarray(a: Any, dtype: Any = None) -> ndarray:
    return _asarray(a, dtype)


def asnumpy(a: Any, stream: Optional[_Stream] = None) -> _np.ndarray:
    return _asnumpy(a, stream)


def empty(shape: Shape, dtype: Any = float) -> ndarray:
    return ndarray(shape, dtype)


def zeros(shape: Shape, dtype: Any = float) -> ndarray:
    return current_client().zeros(shape, dtype)


def ones(shape: Shape, dtype: Any = float) -> ndarray:
    """Made on the host and copied (gpumux has no array arithmetic on the device)."""
    return _asarray(_np.ones(shape, dtype))


def full(shape: Shape, fill_value: Any, dtype: Any = None) -> ndarray:
    """Made on the host and copied."""
    return _asarray(_np.full(shape, fill_value, dtype))


def arange(*args: Any, dtype: Any = None) -> ndarray:
    """Made on the host and copied."""
    return _asarray(_np.arange(*args, dtype=dtype))


def empty_like(a: ndarray, dtype: Any = None) -> ndarray:
    return ndarray(a.shape, a.dtype if dtype is None else dtype)


def zeros_like(a: ndarray, dtype: Any = None) -> ndarray:
    return zeros(a.shape, a.dtype if dtype is None else dtype)


def is_simulated() -> bool:
    """Whether the current client's device is simulated (computes nothing).
    gpumux's own: a program that must also run on CuPy reads it with
    `getattr(cp, "is_simulated", lambda: False)()`."""
    return current_client().is_simulated


class _Device:
    """`cupy.cuda.Device`: the daemon's one device."""

    def __init__(self, device: int = 0) -> None:
        if device != 0:
            raise ValueError(f"device {device}: a gpumuxd serves one device, 0")
        self.id = 0

    def synchronize(self) -> None:
        """Waits for the work queued on every stream of the current client
        (other clients' work is theirs)."""
        current_client().synchronize_all()

    def __enter__(self) -> "_Device":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _CudaNamespace:
    """`cupy.cuda`, the parts covered: `Stream`, `Device`, `get_current_stream`."""

    Device = _Device

    @staticmethod
    def Stream(null: bool = False, non_blocking: bool = False, ptds: bool = False) -> _Stream:  # noqa: N802
        client = current_client()
        return client.default_stream if null else client.stream()

    @staticmethod
    def get_current_stream() -> _Stream:
        return current_client().current_stream


cuda = _CudaNamespace()
