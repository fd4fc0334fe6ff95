from __future__ import annotations

import pytest

from policies.cache_aware import CacheAware
from policies.errors import PolicyConfigError
from policies.factory import DEFAULT_POLICY, PolicyConfig, build_policy, policy_names
from policies.session_hash import SessionHash


def test_all_policies_are_registered_and_cache_aware_is_default() -> None:
    assert policy_names() == ["round_robin", "least_tokens", "session_hash", "prefix_threshold", "cache_aware"]
    assert DEFAULT_POLICY == "cache_aware"
    for name in policy_names():
        assert build_policy(name).name == name
    assert isinstance(build_policy(PolicyConfig()), CacheAware)


def test_params_from_strings_are_converted_to_the_default_types() -> None:
    policy = build_policy(PolicyConfig("session_hash", {"virtual_nodes": "64", "eps": "0.5"}))
    assert isinstance(policy, SessionHash)
    assert policy.virtual_nodes == 64 and policy.eps == 0.5


def test_each_build_is_a_fresh_instance() -> None:
    assert build_policy("round_robin") is not build_policy("round_robin")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (PolicyConfig("random"), "unknown routing policy"),
        (PolicyConfig("cache_aware", {"weight": 1}), "no parameter 'weight'"),
        (PolicyConfig("round_robin", {"eps": 1}), "valid ones: none"),
        (PolicyConfig("cache_aware", {"eps": "lots"}), "not a valid float"),
        (PolicyConfig("cache_aware", {"eps": True}), "give a number"),
        (PolicyConfig("session_hash", {"virtual_nodes": 1.5}), "whole number"),
        (PolicyConfig("cache_aware", {"eps": "-1"}), ">= 0"),
    ],
)
def test_bad_config_is_refused_with_a_clear_error(config: PolicyConfig, message: str) -> None:
    with pytest.raises(PolicyConfigError, match=message):
        build_policy(config)
