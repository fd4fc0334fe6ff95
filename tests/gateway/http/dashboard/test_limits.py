"""The dashboard's cap on one tenant's concurrent usage queries, alone."""

from __future__ import annotations

import pytest

from gateway.errors import ConcurrencyLimited
from gateway.http.dashboard.limits import TenantQueries


def test_a_tenant_past_its_cap_is_refused_at_once_and_others_are_not() -> None:
    queries = TenantQueries(max_per_tenant=2)
    with queries.slot("a"), queries.slot("a"):
        with pytest.raises(ConcurrencyLimited, match="already has 2 dashboard queries running") as refused:
            with queries.slot("a"):
                pass
        assert refused.value.status == 429 and refused.value.retry_after_s
        with queries.slot("b"):
            assert queries.running("b") == 1
        assert queries.running("a") == 2
    assert queries.running("a") == 0


def test_a_query_that_fails_gives_its_slot_back() -> None:
    queries = TenantQueries(max_per_tenant=1)
    with pytest.raises(RuntimeError), queries.slot("a"):
        raise RuntimeError("the store went away")
    with queries.slot("a"):
        assert queries.running("a") == 1
