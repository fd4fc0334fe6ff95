"""Pure decision logic: no I/O, no imports from gateway, backends or engines.

base.py (the Policy interface, Candidate, RouteInfo), one file per routing policy
(round_robin, least_tokens, session_hash, prefix_threshold, cache_aware) built by factory.py; regions.py
(region choice), prefix.py (tenant-salted block hashes), pricing.py (integer micro-unit
billing), limits.py (rate-limit window arithmetic) and sim/ (trace replay of the policies).

    base.py              the Policy interface, Candidate, RouteInfo
    round_robin.py       the next healthy backend in id order
    least_tokens.py      the healthy backend with the fewest tokens in flight
    session_hash.py      consistent hashing with bounded loads on (tenant, session)
    prefix_threshold.py  the reference policy, in the style of the SGLang router's cache_aware
    cache_aware.py       the default: fewest tokens to prefill plus load
    factory.py           a policy built from config
    breaker.py           outlier ejection: a circuit breaker with a half-open probe
    regions.py           region choice
    prefix.py            tenant-salted block hashes
    adapters.py          a LoRA adapter not loaded on a backend, as prefill tokens
    pricing.py           integer micro-unit billing
    limits.py            rate-limit window arithmetic
    errors.py            errors on bad configuration or input
    sim/                 trace replay of the policies
"""
