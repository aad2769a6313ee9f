"""Streams order work and are independent of each other; events mark a
point of a stream. Kernels on the simulated device take the time they are
given (`sim_block_ns`), which is what these tests time."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gpumux
from kernels import SCALE

SLOW_NS = 300_000_000  # one block of 0.3 s


@pytest.fixture
def slow(client: gpumux.Client) -> gpumux.Kernel:
    k = client.compile(SCALE).kernel("nothing")
    k.sim_block_ns = SLOW_NS
    return k


def test_a_stream_waits_for_its_own_work_only(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    busy, free = client.stream(), client.stream()
    t0 = time.perf_counter()
    slow(1, 1, (), stream=busy)
    free.synchronize()
    client.default_stream.synchronize()
    assert time.perf_counter() - t0 < SLOW_NS / 1e9 / 2, "another stream waited for the slow kernel"
    busy.synchronize()
    assert time.perf_counter() - t0 >= SLOW_NS / 1e9 * 0.9


def test_work_on_a_stream_runs_in_order(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    s = client.stream()
    a = client.asarray(np.arange(1000, dtype=np.int32), stream=s)
    t0 = time.perf_counter()
    slow(1, 1, (), stream=s)
    # The copy back is queued behind the kernel on the same stream.
    assert np.array_equal(a.get(stream=s), np.arange(1000, dtype=np.int32))
    assert time.perf_counter() - t0 >= SLOW_NS / 1e9 * 0.9


def test_with_stream_makes_it_current(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    s = client.stream()
    with s:
        assert client.current_stream is s
        t0 = time.perf_counter()
        slow(1, 1, ())  # on s
    assert client.current_stream is client.default_stream
    client.synchronize()  # the default stream: nothing queued
    assert time.perf_counter() - t0 < SLOW_NS / 1e9 / 2
    s.synchronize()
    assert time.perf_counter() - t0 >= SLOW_NS / 1e9 * 0.9


def test_an_event_marks_a_point_of_a_stream(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    s = client.stream()
    t0 = time.perf_counter()
    slow(1, 1, (), stream=s)
    e = s.record()
    assert not e.done
    e.synchronize()
    assert e.done and time.perf_counter() - t0 >= SLOW_NS / 1e9 * 0.9
    e.close()
    with pytest.raises(ValueError, match="closed"):
        e.synchronize()


def test_with_event_waits_at_the_end_of_the_block(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    s = client.stream()
    t0 = time.perf_counter()
    slow(1, 1, (), stream=s)
    with s.record() as e:
        host_work = time.perf_counter() - t0  # the host goes on meanwhile
    assert host_work < SLOW_NS / 1e9 / 2
    assert time.perf_counter() - t0 >= SLOW_NS / 1e9 * 0.9
    assert e._id is None, "the event is forgotten at the end of the block"


def test_synchronize_all_waits_for_every_stream(client: gpumux.Client, slow: gpumux.Kernel) -> None:
    streams = [client.stream() for _ in range(3)]
    t0 = time.perf_counter()
    for s in streams:
        slow(1, 1, (), stream=s)
    client.synchronize_all()
    elapsed = time.perf_counter() - t0
    assert SLOW_NS / 1e9 * 0.9 <= elapsed < 3 * SLOW_NS / 1e9, "the streams ran side by side"


def test_a_stream_of_another_client_is_refused(daemon, client: gpumux.Client) -> None:
    with daemon.connect() as other:
        with pytest.raises(ValueError, match="another gpumux client"):
            client.synchronize(other.stream())
