"""Start gpumuxd from Python, for notebooks and tests:

    with gpumux.sim.daemon("sim:h100") as d:
        x = gpumux.asarray(numpy_array)      # connects to d (GPUMUX_SOCKET is set inside)

The daemon binary is not in the wheel: it is a service of its own (one per
GPU, run by whoever administers the machine), built from the same repository
(`cargo build --release -p gpumuxd`). `daemon()` takes it from its `binary`
argument, else `$GPUMUXD`, else `gpumuxd` on `PATH`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket as _socket
import subprocess
import tempfile
import time
from typing import Any, Iterator, List, Optional, Sequence

from ._client import Client, _forget_default_on

#: The environment variable naming the gpumuxd binary.
BINARY_ENV = "GPUMUXD"


def find_binary(binary: Optional[str] = None) -> str:
    """The gpumuxd to run: `binary`, else `$GPUMUXD`, else `gpumuxd` on `PATH`."""
    for candidate, source in ((binary, "binary="), (os.environ.get(BINARY_ENV), f"${BINARY_ENV}")):
        if candidate:
            if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                raise FileNotFoundError(f"gpumuxd from {source} ({candidate}) is not an executable file")
            return candidate
    found = shutil.which("gpumuxd")
    if found is None:
        raise FileNotFoundError(
            f"gpumuxd not found: pass binary=, set {BINARY_ENV}, or put gpumuxd on PATH "
            "(`cargo build --release -p gpumuxd` in the gpumux repository builds target/release/gpumuxd)"
        )
    return found


class Daemon:
    """A gpumuxd started by `daemon()`: its `socket`, `process` and log."""

    def __init__(self, process: "subprocess.Popen[bytes]", socket: str, log_path: str, device: str) -> None:
        self.process = process
        self.socket = socket
        self.log_path = log_path
        self.device = device

    @property
    def pid(self) -> int:
        return self.process.pid

    def connect(self, **kwargs: Any) -> Client:
        """A new client of this daemon (`connect`'s keyword arguments)."""
        return Client(self.socket, **kwargs)

    def log(self) -> str:
        """What the daemon wrote to stderr so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (every client is told `ShuttingDown`), then SIGKILL after
        `timeout` s; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def __repr__(self) -> str:
        return f"<gpumux.sim.Daemon {self.device} pid {self.pid} at {self.socket}>"


@contextlib.contextmanager
def daemon(
    device: str = "sim:h100",
    *,
    policy: Optional[str] = None,
    args: Sequence[str] = (),
    binary: Optional[str] = None,
    config: Optional[str] = None,
    set_env: bool = True,
    timeout: float = 20.0,
) -> Iterator[Daemon]:
    """Runs gpumuxd on `device` (a simulated one by default: `sim:h100`,
    `sim:h200`, `sim:k20c`; kernels take their time there but compute
    nothing, copies move real bytes) on a socket of its own, for the `with`
    block. `policy`: the scheduling policy; `args`: more gpumuxd options;
    `config`: the text of a config file (TOML, docs/daemon.md).

    Inside the block `GPUMUX_SOCKET` names the daemon's socket (unless
    `set_env=False`), so `gpumux.connect()` and `gpumux.asarray()` use it.
    At the end the daemon is stopped and the default client, if it is this
    daemon's, closed."""
    exe = find_binary(binary)
    # A short path under the temporary directory: a socket's path must fit 108 bytes.
    workdir = tempfile.mkdtemp(prefix="gpumux-sim-")
    sock = os.path.join(workdir, "g.sock")
    log_path = os.path.join(workdir, "gpumuxd.log")
    cmd: List[str] = [exe, "--device", device, "--socket", sock]
    if policy:
        cmd += ["--policy", policy]
    if config is not None:
        cfg = os.path.join(workdir, "config.toml")
        with open(cfg, "w", encoding="utf-8") as f:
            f.write(config)
        cmd += ["--config", cfg]
    cmd += list(args)
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "warn")
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    d = Daemon(process, sock, log_path, device)
    previous = os.environ.get("GPUMUX_SOCKET")
    try:
        _wait_listening(d, timeout)
        if set_env:
            os.environ["GPUMUX_SOCKET"] = sock
        yield d
    finally:
        if set_env:
            if previous is None:
                os.environ.pop("GPUMUX_SOCKET", None)
            else:
                os.environ["GPUMUX_SOCKET"] = previous
        try:
            _forget_default_on(sock)
        finally:
            d.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def _wait_listening(d: Daemon, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if d.process.poll() is not None:
            raise RuntimeError(f"gpumuxd exited with status {d.process.returncode} before listening; its log:\n"
                               + d.log()[-4000:])
        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
            try:
                s.connect(d.socket)
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gpumuxd did not listen on {d.socket} within {timeout} s; its log:\n"
                               + d.log()[-4000:])
        time.sleep(0.02)
