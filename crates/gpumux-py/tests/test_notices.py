"""Notices: a faulting kernel's client and a bystander each learn what they
lost; a stopping daemon says so."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import numpy as np
import pytest

import gpumux
from gpumux.notices import ContextLost, ShuttingDown
from kernels import SCALE, TRAP


def wait_for_notices(c: gpumux.Client, timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        got = c.notices()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def catch(f: Callable[[], None]) -> Optional[BaseException]:
    try:
        f()
    except BaseException as e:  # noqa: BLE001 (handed to the test thread)
        return e
    return None


def test_a_fault_tells_the_culprit_and_the_bystander(daemon) -> None:
    with daemon.connect(name="culprit") as culprit, daemon.connect(name="bystander") as bystander:
        slow = bystander.compile(SCALE).kernel("scale")
        slow.sim_block_ns = 2_000_000_000  # still running when the fault comes
        y = bystander.zeros(64, np.float32)
        slow(1, 64, (y, np.float32(2), np.int32(64)))
        # The bystander waits for its kernel on another thread (the GIL is
        # released while a call waits for the daemon).
        waited: list = []
        waiter = threading.Thread(target=lambda: waited.append(catch(bystander.synchronize)))
        waiter.start()
        time.sleep(0.1)

        x = culprit.zeros(16, np.float32)
        boom = culprit.compile(TRAP).kernel("boom")
        # Its block ends (and the context breaks) 0.2 s after launch: time for the
        # sync to queue behind it (a sync after the fault finds nothing queued).
        boom.sim_block_ns = 200_000_000
        boom(1, 1, (x,))
        with pytest.raises(gpumux.KernelFault):
            culprit.synchronize()
        [n] = wait_for_notices(culprit)
        assert isinstance(n, ContextLost) and n.caused_by_you
        assert "boom" in n.launches and x.handle in n.buffers

        waiter.join(10)
        assert isinstance(waited[0], gpumux.ContextLost), waited
        [m] = wait_for_notices(bystander)
        assert isinstance(m, ContextLost) and not m.caused_by_you
        assert m.launches == ["scale"] and y.handle in m.buffers

        # Both go on: same handles, to be re-filled.
        x.set(np.arange(16, dtype=np.float32))
        assert np.array_equal(x.get(), np.arange(16, dtype=np.float32))
        assert culprit.status()["context_rebuilds"] >= 1


def test_a_stopping_daemon_says_shutting_down(gpumuxd_bin) -> None:
    with gpumux.sim.daemon(binary=gpumuxd_bin) as d:
        c = d.connect()
        c.asarray(np.ones(2)).get()
        assert d.stop() == 0
        assert any(isinstance(n, ShuttingDown) for n in wait_for_notices(c))
        with pytest.raises((gpumux.DaemonGone, gpumux.ShuttingDown)) as e:
            c.asarray(np.ones(2))
        assert e.value.fatal
