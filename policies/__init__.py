"""Pure decision logic: no I/O, no imports from gateway, backends or engines.

base.py (the Policy interface, Candidate, RouteInfo), one file per routing policy
(round_robin, least_tokens, session_hash, prefix_threshold, cache_aware) built by factory.py; regions.py
(region choice), prefix.py (tenant-salted block hashes), pricing.py (integer micro-unit
billing), limits.py (rate-limit window arithmetic) and sim/ (trace replay of the policies).
"""
