"""Region choice: the gateway's own region first, then by configured distance.

`RegionPreference` is the gateway's configuration: its own region and the other regions nearest
first. `choose_region` walks that order and returns the first region with at least one healthy
candidate, or None when there is none anywhere. Regions with backends but missing from the
order come last (alphabetically) unless `include_unlisted` is False, for deployments that must
keep traffic inside the listed regions (data residency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import Candidate
from policies.errors import RegionConfigError


@dataclass(slots=True, frozen=True)
class RegionPreference:
    own: str
    fallbacks: tuple[str, ...] = ()  # other regions, nearest first
    include_unlisted: bool = True

    def __post_init__(self) -> None:
        if not self.own:
            raise RegionConfigError("the gateway's own region must be a non-empty name")
        order = (self.own, *self.fallbacks)
        if len(set(order)) != len(order) or not all(order):
            raise RegionConfigError(f"region order {list(order)} has an empty or repeated name")

    def order(self, known_regions: Sequence[str] = ()) -> list[str]:
        """Every region to try, in order."""
        listed = [self.own, *self.fallbacks]
        if not self.include_unlisted:
            return listed
        return listed + sorted(set(known_regions) - set(listed))


def choose_region(candidates: Sequence[Candidate], preference: RegionPreference) -> str | None:
    """The first region in preference order with a healthy candidate, or None."""
    healthy_regions = {c.region for c in candidates if c.healthy}
    known = {c.region for c in candidates}
    return next((r for r in preference.order(sorted(known)) if r in healthy_regions), None)


def in_region(candidates: Sequence[Candidate], region: str) -> list[Candidate]:
    return [c for c in candidates if c.region == region]
