"""The exceptions of gpumux: one base, `GpumuxError`, and a subclass per
error kind of the daemon (`gpumux_proto::ErrorKind`) and of the client
library. Each also derives from the Python exception it is closest to, so
`except MemoryError` catches `OutOfMemory` and `except ValueError` catches
`InvalidArgument`.

The Rust side (src/errors.rs) raises them through `_from_native`, by name.
"""

from __future__ import annotations

from typing import Optional


class GpumuxError(Exception):
    """Any error of gpumux. `kind` is the daemon's error kind (`"Quota"`,
    `"KernelFault"`, ...) or the client library's (`"NoDaemon"`,
    `"InvalidArgument"`); `request` the request the daemon refused, if one;
    `fatal` whether the client's connection is unusable now (reconnect)."""

    kind: str = "Error"

    def __init__(self, message: str, *, request: Optional[str] = None, fatal: bool = False) -> None:
        super().__init__(message)
        self.request = request
        self.fatal = fatal


# The client library's own errors.
class NoDaemon(GpumuxError, ConnectionError):
    """Nothing listens on the socket (after waiting for a daemon starting)."""

    kind = "NoDaemon"


class CannotConnect(GpumuxError, ConnectionError):
    """The socket exists but cannot be opened (permissions, not a socket)."""

    kind = "Connect"


class DaemonGone(GpumuxError, ConnectionError):
    """The daemon closed the connection, or talking to it failed."""

    kind = "DaemonGone"


class VersionMismatch(GpumuxError):
    """The daemon and this package speak different protocol versions."""

    kind = "Mismatch"


class SharedMemoryError(GpumuxError, OSError):
    """The shared-memory region for copies could not be made."""

    kind = "Shm"


class NoSuchKernel(GpumuxError, KeyError):
    """The module has no kernel of that name; the message lists its kernels."""

    kind = "NoSuchKernel"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidArgument(GpumuxError, ValueError):
    """The call is wrong before anything is sent (a copy past an array's end,
    kernel arguments that do not match its parameters)."""

    kind = "InvalidArgument"


class ClientClosed(GpumuxError):
    """The client was closed."""

    kind = "ClientClosed"


# The daemon's error kinds.
class BadFrame(GpumuxError):
    kind = "BadFrame"


class ProtocolError(GpumuxError):
    kind = "Protocol"


class NotPermitted(GpumuxError, PermissionError):
    """The daemon's config does not allow this user, priority or weight."""

    kind = "NotPermitted"


class QuotaExceeded(GpumuxError):
    """Over a limit of the daemon's config (memory, queued operations, host memory)."""

    kind = "Quota"


class OutOfMemory(GpumuxError, MemoryError):
    """The device has no memory left."""

    kind = "OutOfMemory"


class NoSuchHandle(GpumuxError):
    kind = "NoSuchHandle"


class OutOfRange(GpumuxError, IndexError):
    kind = "OutOfRange"


class InvalidValue(GpumuxError, ValueError):
    """The daemon refused a malformed value (a grid of 0, a block over 1024 threads)."""

    kind = "Invalid"


class CompileError(GpumuxError):
    """The module does not compile; the message holds the compiler's log."""

    kind = "Compile"


class TransformError(CompileError):
    """gpumux's kernel transformation refuses a kernel; `line` is the source line."""

    kind = "Transform"

    def __init__(self, message: str, *, line: Optional[int] = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.line = line


class KernelFault(GpumuxError):
    """A kernel of this client faulted (or is a suspect); the context was rebuilt
    and this client's device memory contents are gone."""

    kind = "KernelFault"


class ContextLost(GpumuxError):
    """Another client's kernel broke the context; this client's work listed in the
    message was lost and its device memory contents are gone."""

    kind = "ContextLost"


class DeviceError(GpumuxError):
    kind = "Device"


class ShuttingDown(GpumuxError):
    kind = "ShuttingDown"


class NotReady(GpumuxError):
    """What was asked of is not done yet (an event's time before its work ended)."""

    kind = "NotReady"


_BY_KIND = {
    cls.kind: cls
    for cls in (
        NoDaemon, CannotConnect, DaemonGone, VersionMismatch, SharedMemoryError, NoSuchKernel, InvalidArgument,
        ClientClosed, BadFrame, ProtocolError, NotPermitted, QuotaExceeded, OutOfMemory, NoSuchHandle, OutOfRange,
        InvalidValue, CompileError, TransformError, KernelFault, ContextLost, DeviceError, ShuttingDown,
        NotReady,
    )
}
# Shown as gpumux.X in tracebacks, where users import them from.
for _cls in (GpumuxError, *_BY_KIND.values()):
    _cls.__module__ = "gpumux"
# The protocol's version mismatch is a daemon kind too.
_BY_KIND["Version"] = VersionMismatch


def _from_native(kind: str, message: str, request: Optional[str], fatal: bool, line: Optional[int]) -> GpumuxError:
    """The exception for an error of the Rust client (src/errors.rs)."""
    cls = _BY_KIND.get(kind, GpumuxError)
    if cls is TransformError:
        return TransformError(message, line=line, request=request, fatal=fatal)
    return cls(message, request=request, fatal=fatal)
