from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from loadtests.tenants import ProvisionError, TenantKey, TenantSpec, load_keys, parse_tenants, pick, save_keys


def test_parse_tenants() -> None:
    assert parse_tenants("acme:3, globex") == [TenantSpec("acme", 3.0), TenantSpec("globex", 1.0)]
    for bad in ("", "acme:0", "acme:x", ":2", "a,a"):
        with pytest.raises(ValueError):
            parse_tenants(bad)


def test_pick_follows_the_weights() -> None:
    keys = [TenantKey("a", "t1", "x", "s", 3.0), TenantKey("b", "t2", "y", "s", 1.0)]
    counts = Counter(pick(random.Random(i), keys).name for i in range(4000))
    assert 0.70 < counts["a"] / 4000 < 0.80


def test_keys_round_trip_through_a_file(tmp_path: Path) -> None:
    keys = [TenantKey("a", "t1", "acct-a", "secret", 2.0)]
    save_keys(tmp_path / "keys.json", keys)
    assert load_keys(tmp_path / "keys.json") == keys
    (tmp_path / "bad.json").write_text('[{"name": "a"}]')
    with pytest.raises(ProvisionError, match="expected a JSON list"):
        load_keys(tmp_path / "bad.json")
