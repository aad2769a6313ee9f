"""Device memory is freed when an array is collected, at free(), and when
its client closes; `with` blocks make a client current."""

from __future__ import annotations

import gc

import numpy as np

import gpumux

MIB = 1 << 20


def test_collected_arrays_free_their_memory(client: gpumux.Client) -> None:
    base = client.memory_used()
    a = client.asarray(np.ones(4 * MIB, np.uint8))
    assert client.memory_used() == base + 4 * MIB
    del a
    gc.collect()
    assert client.memory_used() == base


def test_a_view_keeps_the_memory(client: gpumux.Client) -> None:
    base = client.memory_used()
    a = client.zeros(MIB, np.uint8)
    v = a[10:20]
    del a
    gc.collect()
    assert client.memory_used() == base + MIB
    assert not v.get().any()
    del v
    gc.collect()
    assert client.memory_used() == base


def test_free_frees_at_once(client: gpumux.Client) -> None:
    base = client.memory_used()
    a = client.empty(3 * MIB, np.uint8)
    a.free()
    assert a.freed and client.memory_used() == base


def test_closing_frees_everything(daemon) -> None:
    with daemon.connect(name="watcher") as watcher:
        before = watcher.status()["memory_used"]
        c = daemon.connect(name="leaver")
        keep = [c.empty(2 * MIB, np.uint8) for _ in range(3)]
        assert watcher.status()["memory_used"] == before + 6 * MIB
        c.close()
        assert watcher.status()["memory_used"] == before
        assert all(r["client"] != c.id for r in watcher.status()["clients"])
        del keep


def test_with_makes_a_client_current_and_closes_it(daemon) -> None:
    with daemon.connect(name="outer") as outer:
        with daemon.connect(name="inner") as inner:
            assert gpumux.current_client() is inner
            assert gpumux.zeros(3).client is inner
        assert inner.closed
        assert gpumux.current_client() is outer


def test_priority_and_weight_are_settable(client: gpumux.Client) -> None:
    client.priority = 0
    client.weight = 2.5
    row = next(r for r in client.status()["clients"] if r["client"] == client.id)
    assert row["weight"] == 2.5 and row["priority"] == 0 and client.weight == 2.5
    too_high = client.limits["max_priority"] + 1
    try:
        client.priority = too_high
    except gpumux.NotPermitted as e:
        assert isinstance(e, PermissionError)
        assert client.priority == 0
    else:
        raise AssertionError(f"priority {too_high} over the limit was accepted")
