"""Errors arrive as exceptions of the daemon's kinds (and Python's own bases),
with the daemon's or the library's message."""

from __future__ import annotations

import numpy as np
import pytest

import gpumux
from kernels import SCALE


def test_no_daemon_names_the_socket(tmp_path) -> None:
    sock = str(tmp_path / "none.sock")
    with pytest.raises(gpumux.NoDaemon) as e:
        gpumux.connect(sock, wait=0)
    assert isinstance(e.value, ConnectionError) and e.value.fatal
    assert sock in str(e.value) and "GPUMUX_SOCKET" in str(e.value)


def test_gpumux_socket_is_honoured(daemon, monkeypatch) -> None:
    monkeypatch.setenv("GPUMUX_SOCKET", daemon.socket)
    with gpumux.Client() as c:
        assert c.socket == daemon.socket and c.device == "sim:h100"
    monkeypatch.setenv("GPUMUX_SOCKET", daemon.socket + ".missing")
    with pytest.raises(gpumux.NoDaemon):
        gpumux.Client(wait=0)


def test_over_the_memory_quota(client: gpumux.Client) -> None:
    with pytest.raises(gpumux.GpumuxError) as e:
        client.empty(client.limits["memory_bytes"] + 1, np.uint8)
    assert isinstance(e.value, (gpumux.QuotaExceeded, gpumux.OutOfMemory)), type(e.value)
    assert e.value.request == "Alloc" and not e.value.fatal
    client.asarray(np.ones(4)).get()  # the client goes on


def test_a_compile_error_names_the_line(client: gpumux.Client) -> None:
    with pytest.raises(gpumux.CompileError, match="line 2"):
        client.compile('extern "C" __global__ void k(float* x) {\n  x[0] = (1;\n}\n')


def test_a_transform_refusal_has_its_line(client: gpumux.Client) -> None:
    src = ('#include <cooperative_groups.h>\n'
           'extern "C" __global__ void k(float* x) {\n'
           '  cooperative_groups::this_grid().sync();\n'
           '}\n')
    with pytest.raises(gpumux.TransformError) as e:
        client.compile(src)
    assert e.value.line == 3 and isinstance(e.value, gpumux.CompileError)


def test_no_such_kernel_lists_the_module(client: gpumux.Client) -> None:
    m = client.compile(SCALE)
    assert sorted(m.kernels) == ["nothing", "scale"]
    with pytest.raises(gpumux.NoSuchKernel) as e:
        m.kernel("scal")
    assert isinstance(e.value, KeyError)
    assert "nothing" in str(e.value) and "scale" in str(e.value)


def test_arguments_are_checked_before_sending(client: gpumux.Client) -> None:
    k = client.compile(SCALE).kernel("scale")
    assert k.param_sizes == [8, 4, 4]
    x = client.zeros(8, np.float32)
    k(1, 8, (x, np.float32(2), np.int32(8)))  # right
    with pytest.raises(gpumux.InvalidArgument, match="argument 3 of scale is 8 bytes"):
        k(1, 8, (x, np.float32(2), 8))  # a Python int is an int64, as in CuPy
    with pytest.raises(ValueError, match="takes 3 parameters, 2 arguments"):
        k(1, 8, (x, np.float32(2)))
    with pytest.raises(gpumux.InvalidArgument, match=r"kernel argument 2 \(list\)"):
        k(1, 8, (x, [1.0], np.int32(8)))
    client.synchronize()


def test_a_bad_launch_fails_at_the_next_sync(client: gpumux.Client) -> None:
    k = client.compile(SCALE).kernel("nothing")
    k(1, (2048, 1, 1), ())  # more threads per block than CUDA allows: found by the daemon
    with pytest.raises(gpumux.InvalidValue) as e:
        client.synchronize()
    assert e.value.request == "Launch" and "1024" in str(e.value)
    k(1, 32, ())
    client.synchronize()  # reported once; the client goes on


def test_freed_memory_cannot_be_used(client: gpumux.Client) -> None:
    a = client.asarray(np.ones(4, np.float32))
    a.free()
    a.free()  # twice is fine
    with pytest.raises(gpumux.InvalidArgument, match="was freed"):
        a.get()
    k = client.compile(SCALE).kernel("scale")
    with pytest.raises(gpumux.InvalidArgument, match="was freed"):
        k(1, 4, (a, np.float32(1), np.int32(4)))


def test_another_clients_array_is_refused(daemon, client: gpumux.Client) -> None:
    k = client.compile(SCALE).kernel("scale")
    with daemon.connect(name="other") as other:
        x = other.zeros(4, np.float32)
        with pytest.raises(gpumux.InvalidArgument, match="another gpumux client"):
            k(1, 4, (x, np.float32(1), np.int32(4)))
        with pytest.raises(ValueError, match="another gpumux client"):
            client.asarray(x)


def test_a_closed_client_says_so(daemon) -> None:
    c = daemon.connect()
    a = c.asarray(np.ones(3))
    c.close()
    c.close()  # twice is fine
    with pytest.raises(gpumux.ClientClosed):
        c.asarray(np.ones(3))
    with pytest.raises(gpumux.ClientClosed):
        a.get()
    a.free()  # nothing to do: the daemon freed it when the client left
    assert "closed" in repr(c)


def test_grid_and_block_take_ints_and_sequences_as_cupy_does(client: gpumux.Client) -> None:
    # Converted by the extension, not in Python (issue 41's launch cost): the
    # shapes CuPy takes run, the others are refused before anything is sent,
    # naming which of grid and block is wrong.
    k = client.compile(SCALE).kernel("nothing")
    for grid, block in [(1, 1), ((2,), (4, 2)), ((1, 2, 3), [8, 1, 1]), (np.int64(3), (np.uint32(2), 2))]:
        k(grid, block, ())
    client.synchronize()
    for grid, block, wrong in [((1, 1, 1, 1), 1, "grid"), (1, (), "block"), (1, [1, 2, 3, 4], "block"), (1.5, 1, "grid")]:
        with pytest.raises(ValueError, match=f"{wrong} must be an int or a tuple of 1 to 3 ints"):
            k(grid, block, ())
    for grid, block, wrong in [(-1, 1, "grid"), (1, (2**32, 1), "block"), ("4", 1, "grid")]:
        with pytest.raises(ValueError, match=f"{wrong} extents must be ints of 0 to 4294967295"):
            k(grid, block, ())
    client.synchronize()
