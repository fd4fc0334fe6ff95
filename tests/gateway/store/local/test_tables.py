"""The local store's tables, on a hand-driven clock."""

from __future__ import annotations

from gateway.store.local.tables import PrefixTable, TtlMap, WindowCounters
from tests.clock import Clock


def test_ttl_map_expires_and_evicts_the_oldest_write() -> None:
    clock = Clock()
    table: TtlMap[str, int] = TtlMap(max_entries=2, ttl_s=10, clock=clock)
    table.set("a", 1)
    clock.now += 5
    table.set("b", 2)
    table.set("a", 3)  # rewritten: now the newest
    table.set("c", 4)
    assert (table.get("a"), table.get("b"), table.get("c")) == (3, None, 4)
    clock.now += 10
    assert table.get("a") is None
    table.set("d", 5)  # writing also drops what expired
    assert len(table) == 1


def test_prefix_table_drops_stale_front_entries_on_write() -> None:
    clock = Clock()
    table = PrefixTable(max_entries=100, ttl_s=10, clock=clock)
    table.record("A", [1, 2, 3])
    clock.now += 11
    table.record("B", [4])
    assert len(table) == 1 and table.match([1]) == {} and table.match([4]) == {"B": 1}


def test_prefix_table_cap_evicts_chain_tails_first() -> None:
    table = PrefixTable(max_entries=3, ttl_s=10, clock=Clock())
    table.record("A", [1, 2, 3, 4, 5])
    assert table.match([1, 2, 3, 4, 5]) == {"A": 3}


def test_window_counters_roll_and_sweep() -> None:
    counters = WindowCounters(window_ms=1000)
    counters.add("k", 500, 7)
    assert counters.counts("k", 999) == (0, 7)
    assert counters.counts("k", 1000) == (7, 0)  # rolled: current became previous
    assert counters.counts("k", 3000) == (0, 0)  # two windows on: both gone
    counters.add("k", 3000, 2)
    counters.add("k", 3000, -5)  # a refund larger than the window stops at zero
    assert counters.counts("k", 3000) == (0, 0)
    for i in range(5000):  # idle scopes are swept away (every 4096 operations)
        counters.add(f"s{i}", i * 10, 1)
    assert len(counters) <= 5000 - 4096 + 200
