"""One daemon on the simulated H100 for the whole session (as CI runs it);
each test gets a client of its own, closed after it.

gpumuxd comes from $GPUMUXD, else PATH, else the repository's
target/release or target/debug (a `cargo build -p gpumuxd` away)."""

from __future__ import annotations

import os
import pathlib
from typing import Iterator

import pytest

import gpumux

REPO = pathlib.Path(__file__).resolve().parents[3]


def gpumuxd() -> str:
    try:
        return gpumux.sim.find_binary()
    except FileNotFoundError:
        target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
        for profile in ("release", "debug"):
            if (target / profile / "gpumuxd").exists():
                return str(target / profile / "gpumuxd")
        raise


@pytest.fixture(scope="session")
def gpumuxd_bin() -> str:
    return gpumuxd()


@pytest.fixture(scope="session")
def daemon(gpumuxd_bin: str) -> Iterator[gpumux.sim.Daemon]:
    with gpumux.sim.daemon("sim:h100", binary=gpumuxd_bin) as d:
        yield d


@pytest.fixture
def client(daemon: gpumux.sim.Daemon, request: pytest.FixtureRequest) -> Iterator[gpumux.Client]:
    with daemon.connect(name=request.node.name[:60]) as c:
        yield c
