"""Build a routing policy from configuration: a name plus parameters.

Parameters may arrive as strings (TOML, environment, command line); each is converted to the
type of the constructor's default for that name. Unknown names and parameters are refused with
the list of valid ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.base import Policy
from policies.cache_aware import CacheAware
from policies.errors import PolicyConfigError
from policies.least_tokens import LeastTokens
from policies.prefix_threshold import PrefixThreshold
from policies.round_robin import RoundRobin
from policies.session_hash import SessionHash

DEFAULT_POLICY = CacheAware.name
POLICIES: Mapping[str, type[Policy]] = MappingProxyType(
    {cls.name: cls for cls in (RoundRobin, LeastTokens, SessionHash, PrefixThreshold, CacheAware)}
)


@dataclass(slots=True, frozen=True)
class PolicyConfig:
    name: str = DEFAULT_POLICY
    params: Mapping[str, object] = field(default_factory=dict)


def policy_names() -> list[str]:
    return list(POLICIES)


def build_policy(config: PolicyConfig | str) -> Policy:
    """A fresh policy instance (policies may hold state, e.g. a round-robin counter)."""
    if isinstance(config, str):
        config = PolicyConfig(config)
    cls = POLICIES.get(config.name)
    if cls is None:
        raise PolicyConfigError(f"unknown routing policy {config.name!r}; choose one of {policy_names()}")
    defaults = {
        name: p.default for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"
    }
    kwargs = {}
    for name, value in config.params.items():
        if name not in defaults:
            raise PolicyConfigError(
                f"policy {config.name!r} has no parameter {name!r}; valid ones: {sorted(defaults) or 'none'}"
            )
        kwargs[name] = _coerce(config.name, name, value, type(defaults[name]))
    return cls(**kwargs)


def _coerce(policy: str, name: str, value: object, kind: type) -> object:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PolicyConfigError(f"{policy}.{name}={value!r}: give a number")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise PolicyConfigError(f"{policy}.{name}={value!r}: give a whole number")
    try:
        return kind(value)
    except ValueError:
        raise PolicyConfigError(f"{policy}.{name}={value!r}: not a valid {kind.__name__}") from None
