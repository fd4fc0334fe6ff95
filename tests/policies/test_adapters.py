"""policies/adapters.py: a backend without the request's LoRA adapter costs its load, weighed like a prefix miss."""

from __future__ import annotations

from policies.adapters import adapter_load_tokens
from policies.base import Candidate, RouteInfo
from policies.cache_aware import CacheAware


def test_only_a_request_with_an_adapter_not_loaded_pays() -> None:
    assert adapter_load_tokens(None, frozenset(), 256) == 0
    assert adapter_load_tokens("ft", {"ft"}, 256) == 0
    assert adapter_load_tokens("ft", {"other"}, 256) == 256


def test_cache_aware_prefers_the_backend_holding_the_adapter_until_its_load_outweighs_it() -> None:
    info = RouteInfo(tenant="t", request_id="r", num_prompt_tokens=100, num_output_tokens=10)

    def pick(loaded_load: int) -> str:
        loaded = Candidate("loaded", in_flight_prefill_tokens=loaded_load)
        cold = Candidate("cold", adapter_load_tokens=adapter_load_tokens("ft", frozenset(), 256))
        return CacheAware().select([cold, loaded], info).id  # type: ignore[union-attr]

    assert pick(0) == "loaded"
    assert pick(200) == "loaded"  # 200 queued tokens < loading the adapter elsewhere (256)
    assert pick(400) == "cold"
