"""gpumux.sim: finding gpumuxd, starting and stopping it, the environment."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gpumux


def test_a_missing_binary_says_where_it_looked(monkeypatch) -> None:
    monkeypatch.delenv("GPUMUXD", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError, match="set GPUMUXD, or put gpumuxd on PATH"):
        gpumux.sim.find_binary()
    with pytest.raises(FileNotFoundError, match="binary="):
        gpumux.sim.find_binary("/nonexistent/gpumuxd")
    monkeypatch.setenv("GPUMUXD", "/nonexistent/gpumuxd")
    with pytest.raises(FileNotFoundError, match=r"\$GPUMUXD"):
        gpumux.sim.find_binary()


def test_a_daemon_that_cannot_start_shows_its_log(gpumuxd_bin) -> None:
    with pytest.raises(RuntimeError, match="before listening; its log"):
        with gpumux.sim.daemon("sim:nonesuch", binary=gpumuxd_bin):
            pass


def test_the_block_sets_gpumux_socket_and_the_end_restores_it(gpumuxd_bin, monkeypatch) -> None:
    monkeypatch.setenv("GPUMUX_SOCKET", "/before.sock")
    with gpumux.sim.daemon("sim:h200", binary=gpumuxd_bin, policy="fcfs") as d:
        assert os.environ["GPUMUX_SOCKET"] == d.socket
        x = gpumux.asarray(np.arange(3.0))  # the default client, connected to d
        assert x.client.device == "sim:h200" and x.client.policy == "fcfs"
        default = x.client
    assert os.environ["GPUMUX_SOCKET"] == "/before.sock"
    assert default.closed, "the default client of a stopped daemon is closed"
    assert not os.path.exists(d.socket) and not d.alive()
