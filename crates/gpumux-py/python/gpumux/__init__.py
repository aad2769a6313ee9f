"""gpumux: share a GPU through gpumuxd from Python.

    import gpumux, numpy as np
    x = gpumux.asarray(np.arange(4, dtype=np.float32))   # to the device
    print(x, x.get())                                     # back

`gpumux.cupy` runs programs written for CuPy's RawKernel/RawModule with one
changed import; `gpumux.sim.daemon("sim:h100")` starts a daemon on a
simulated GPU. docs/python.md in the repository has the rest.
"""

from ._array import asarray, asnumpy, empty, ndarray, zeros
from ._client import Client, Event, Kernel, Module, Stream, connect, current_client
from ._errors import (
    BadFrame,
    CannotConnect,
    ClientClosed,
    CompileError,
    ContextLost,
    DaemonGone,
    DeviceError,
    GpumuxError,
    InvalidArgument,
    InvalidValue,
    KernelFault,
    NoDaemon,
    NoSuchHandle,
    NoSuchKernel,
    NotPermitted,
    NotReady,
    OutOfMemory,
    OutOfRange,
    ProtocolError,
    QuotaExceeded,
    SharedMemoryError,
    ShuttingDown,
    TransformError,
    VersionMismatch,
)
from . import notices
from . import sim

__all__ = [
    "Client", "Event", "Kernel", "Module", "Stream", "asarray", "asnumpy", "connect", "current_client", "empty",
    "ndarray", "notices", "sim", "zeros",
    "BadFrame", "CannotConnect", "ClientClosed", "CompileError", "ContextLost", "DaemonGone", "DeviceError",
    "GpumuxError", "InvalidArgument", "InvalidValue", "KernelFault", "NoDaemon", "NoSuchHandle", "NoSuchKernel",
    "NotPermitted", "NotReady", "OutOfMemory", "OutOfRange", "ProtocolError", "QuotaExceeded", "SharedMemoryError",
    "ShuttingDown", "TransformError", "VersionMismatch",
]
