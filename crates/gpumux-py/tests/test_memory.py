"""Arrays round-trip through the daemon's memory bitwise, whatever their
dtype, shape or size; views, copies and repr."""

from __future__ import annotations

import numpy as np
import pytest

import gpumux

DTYPES = [np.float32, np.float64, np.int8, np.uint16, np.int32, np.int64, np.uint64, np.complex64, np.bool_,
          np.float16]
SHAPES = [(0,), (1,), (7,), (3, 4), (2, 3, 5), ()]


def sample(shape: tuple, dtype: type, seed: int = 0) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize,
                                               dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw = raw & 1
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_is_bitwise(client: gpumux.Client, shape: tuple, dtype: type) -> None:
    host = sample(shape, dtype)
    dev = client.asarray(host)
    assert dev.shape == host.shape and dev.dtype == host.dtype and dev.nbytes == host.nbytes
    back = dev.get()
    assert back.dtype == host.dtype and back.shape == host.shape
    assert back.tobytes() == host.tobytes()


def test_a_large_copy_round_trips_and_reports_progress(client: gpumux.Client) -> None:
    # 160 MiB: larger than the staging region's 32 MiB and in three progress pieces.
    host = sample((40 << 20,), np.float32, seed=1)
    seen: list = []
    dev = client.asarray(host, progress=lambda done, total: seen.append((done, total)))
    assert [d for d, _ in seen] == [64 << 20, 128 << 20, 160 << 20]
    assert all(t == host.nbytes for _, t in seen)
    out = np.empty_like(host)
    assert dev.get(out=out) is out
    assert out.tobytes() == host.tobytes()  # bitwise: random bits include NaNs


def test_progress_true_prints_a_line(client: gpumux.Client, capsys: pytest.CaptureFixture) -> None:
    client.asarray(np.zeros(1 << 20, np.uint8), progress=True)
    err = capsys.readouterr().err
    assert "gpumux: copied 1/1 MiB to the device" in err and err.endswith("GB/s)\n")


def test_module_functions_use_the_current_client(client: gpumux.Client) -> None:
    host = np.arange(12, dtype=np.int32).reshape(3, 4)
    d = gpumux.asarray(host)
    assert d.client is client
    assert np.array_equal(gpumux.asnumpy(d), host)
    assert np.array_equal(gpumux.zeros((2, 3), np.float32).get(), np.zeros((2, 3), np.float32))
    e = gpumux.empty(5, np.uint8)
    assert e.shape == (5,) and e.dtype == np.uint8
    assert gpumux.asarray(d) is d, "an array of the client comes back as it is"
    assert gpumux.asarray(d, dtype=np.float64).dtype == np.float64


def test_zeros_clears_reused_memory(client: gpumux.Client) -> None:
    a = client.asarray(np.full(1000, 7, np.int64))
    a.free()
    assert not client.zeros(1000, np.int64).get().any()


def test_views_share_memory_and_read_the_right_bytes(client: gpumux.Client) -> None:
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = client.asarray(host)
    assert np.array_equal(d[1].get(), host[1])
    assert np.array_equal(d[-1].get(), host[-1])
    assert np.array_equal(d[1:3].get(), host[1:3])
    assert np.array_equal(d.reshape(6, -1).get(), host.reshape(6, -1))
    assert np.array_equal(d.ravel()[5:9].get(), host.ravel()[5:9])
    assert np.array_equal(d.view(np.uint32).get(), host.view(np.uint32))
    d[2:4].set(np.zeros((2, 6), np.float32))
    expect = host.copy()
    expect[2:4] = 0
    assert np.array_equal(d.get(), expect)
    with pytest.raises(IndexError, match="step 1"):
        d[::2]
    with pytest.raises(IndexError, match="out of bounds"):
        d[4]
    with pytest.raises(ValueError, match="cannot reshape"):
        d.reshape(5, 5)


def test_copy_is_independent(client: gpumux.Client) -> None:
    a = client.asarray(np.arange(10, dtype=np.int16))
    b = a.copy()
    a.set(np.zeros(10, np.int16))
    assert np.array_equal(b.get(), np.arange(10, dtype=np.int16))


def test_set_checks_the_shape(client: gpumux.Client) -> None:
    a = client.empty((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        a.set(np.zeros(3))
    with pytest.raises(ValueError, match="out must be"):
        a.get(out=np.zeros((2, 2), np.float64))


def test_repr_is_numpys_with_where_it_lives(client: gpumux.Client) -> None:
    for host in (np.array([1.0, 2.5, 3.0], np.float32), np.arange(6.0).reshape(2, 3), np.zeros(0, np.int8)):
        d = client.asarray(host)
        assert repr(d) == repr(host)[:-1] + f", device='sim:h100, client {client.id}')"
        assert str(d) == str(host)
    d.free()
    assert "freed" not in repr(d), "an empty array has nothing to free"
    f = client.asarray(np.ones(3))
    f.free()
    assert repr(f) == "<gpumux.ndarray freed, shape=(3,), dtype=float64>"


def test_conversion_to_numpy_is_explicit(client: gpumux.Client) -> None:
    d = client.asarray(np.ones(3))
    with pytest.raises(TypeError, match=r"use \.get\(\)"):
        np.asarray(d)
    assert not hasattr(d, "__dlpack__"), "no DLPack: the client has no CUDA context (docs/python.md)"
