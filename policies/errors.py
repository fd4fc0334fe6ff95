"""Errors raised by policies on bad configuration or bad input.

    PolicyError (ValueError)
    ├── PolicyConfigError   unknown policy name or bad policy parameter
    ├── RegionConfigError   region distance order that names no region or repeats one
    ├── PricingError        bad price string, cached price above input, negative usage
    └── LimitRuleError      non-positive window or limit

They subclass ValueError so a settings loader that already maps ValueError to a start-up
failure keeps working; messages say what was wrong and how to fix it.
"""

from __future__ import annotations


class PolicyError(ValueError):
    pass


class PolicyConfigError(PolicyError):
    pass


class RegionConfigError(PolicyError):
    pass


class PricingError(PolicyError):
    pass


class LimitRuleError(PolicyError):
    pass
