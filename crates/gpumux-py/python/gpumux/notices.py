"""What the daemon tells a client unasked (`Client.notices()`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple, Union


@dataclass(frozen=True)
class ContextLost:
    """The device's context was lost and rebuilt (a kernel fault, a device
    process that died). What of this client's went with it: `launches` (kernel
    names, one per launch), `copies` (copies and memsets), `buffers` (handles,
    as `ndarray.handle`, whose contents are gone: re-fill them)."""

    caused_by_you: bool
    what: str
    launches: List[str] = field(default_factory=list)
    copies: int = 0
    buffers: List[int] = field(default_factory=list)


@dataclass(frozen=True)
class ShuttingDown:
    """The daemon is stopping; the connection closes next."""


Notice = Union[ContextLost, ShuttingDown]


def _from_native(t: Tuple[object, ...]) -> Notice:
    if t[0] == "ContextLost":
        _, caused, what, launches, copies, buffers = t
        assert isinstance(launches, list) and isinstance(copies, int) and isinstance(buffers, list)
        return ContextLost(bool(caused), str(what), launches, copies, buffers)
    return ShuttingDown()
