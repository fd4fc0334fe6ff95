from __future__ import annotations

import pytest

from policies.base import Candidate
from policies.errors import RegionConfigError
from policies.regions import RegionPreference, choose_region, in_region


def backends(*specs: tuple[str, str, bool]) -> list[Candidate]:
    return [Candidate(bid, region=region, healthy=healthy) for bid, region, healthy in specs]


PREF = RegionPreference("fra", ("ams", "lhr", "iad"))


def test_own_region_first() -> None:
    cands = backends(("a", "ams", True), ("f", "fra", True))
    assert choose_region(cands, PREF) == "fra"


def test_falls_back_by_distance_order_skipping_regions_without_healthy_backends() -> None:
    cands = backends(("f", "fra", False), ("a", "ams", False), ("l", "lhr", True), ("i", "iad", True))
    assert choose_region(cands, PREF) == "lhr"


def test_none_when_no_region_has_a_healthy_backend() -> None:
    assert choose_region(backends(("f", "fra", False)), PREF) is None
    assert choose_region([], PREF) is None


def test_unlisted_regions_come_last_unless_excluded() -> None:
    cands = backends(("f", "fra", False), ("s", "sin", True), ("n", "nrt", True))
    assert choose_region(cands, PREF) == "nrt"  # alphabetical after the listed ones
    strict = RegionPreference("fra", ("ams",), include_unlisted=False)
    assert choose_region(cands, strict) is None


def test_in_region_filters_candidates() -> None:
    cands = backends(("a", "ams", True), ("f", "fra", True), ("g", "fra", False))
    assert [c.id for c in in_region(cands, "fra")] == ["f", "g"]


@pytest.mark.parametrize("fallbacks", [("ams", "ams"), ("fra",), ("",)])
def test_repeated_or_empty_regions_are_refused(fallbacks: tuple[str, ...]) -> None:
    with pytest.raises(RegionConfigError):
        RegionPreference("fra", fallbacks)
