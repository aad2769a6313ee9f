"""A client killed with SIGKILL mid-kernel: the daemon frees what it held and
the other clients go on. (Its block in flight runs to its end first, as on a
GPU, so the memory comes back within the block's 2 s.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import gpumux

VICTIM = textwrap.dedent(r'''
    import sys, numpy as np, gpumux
    from kernels import SCALE
    c = gpumux.connect(sys.argv[1], name="victim")
    x = c.asarray(np.ones(8 << 20, np.float32))      # 32 MiB
    k = c.compile(SCALE).kernel("scale")
    k.sim_block_ns = 2_000_000_000                   # 2 s per block
    k(1, 256, (x, np.float32(2), np.int32(8 << 20)))
    print(c.id, flush=True)
    sys.stdin.read()                                 # until killed
''')


def test_a_killed_client_leaves_nothing_behind(daemon, client: gpumux.Client) -> None:
    before = client.status()["memory_used"]
    here = os.path.dirname(__file__)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, daemon.socket], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, cwd=here, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))})
    try:
        assert victim.stdout is not None
        victim_id = int(victim.stdout.readline())
        row = next(r for r in client.status()["clients"] if r["client"] == victim_id)
        assert row["memory_used"] == 32 << 20 and row["pid"] == victim.pid
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    deadline = time.monotonic() + 15
    while True:
        s = client.status()
        gone = all(r["client"] != victim_id for r in s["clients"])
        if gone and s["memory_used"] == before:
            break
        assert time.monotonic() < deadline, f"the daemon still holds the victim's memory: {s}"
        time.sleep(0.05)
    # The other client goes on.
    a = client.asarray(np.arange(100, dtype=np.uint32))
    assert np.array_equal(a.get(), np.arange(100, dtype=np.uint32))
    assert daemon.alive()
