"""Key names and hash encodings of the Redis store.

Every key starts with `key_prefix`. Ids inside key names are checked (no ":"), so no two
things share a name:

    {p}tenant:{id}                  hash    a tenant
    {p}tenants                      set     tenant ids
    {p}account:{account_id}         string  owning tenant id
    {p}apikey:{sha256}              hash    a key, found by the hash of its secret
    {p}apikey_id:{key_id}           string  sha256 of that key's secret
    {p}tenant_keys:{tenant_id}      set     key ids
    {p}rl:{key_id}:{rpm|tpm}:...    string  one sliding-window counter (policies.limits.window_key)
    {p}budget:{tenant_id}:{month}   string  spend in micro-units
    {p}budget_token:{token}         string  one reserve_budget call: its amount, or 'undone' (EX 120 s)
    {p}session:{tenant_id}:{sid}    string  backend id (PX ttl)
    {p}prefix:{block_hash}          zset    backend -> last recorded µs (PX ttl)
    {p}prefix_lru                   zset    block hash -> last recorded µs (the size cap)
    {p}inflight:{replica}:prefill   hash    backend -> tokens (PX lease), also :decode
    {p}inflight_replicas            set     replica ids that may hold counts
    {p}slots:{tenant_id}            zset    request id -> lease end (ms, Redis clock): requests in flight
    {p}ledger                       stream  usage records (XADD; archived ones XDEL'd, see ledger.py)
    {p}ledger_req:{request_id}      string  stream id of that request's record (the idempotency key, PX ttl)
    {p}ledger_by_time[:{tenant}]    zset    "{ended_us:016d}:{request_id}\\0{stream id}", all score 0 (BYLEX)
    {p}ledger_archived_before       string  µs: records that ended before may be in the archive only
    {p}ledger_archive_id            string  the id of the one archive file this ledger moves records to
    {p}ledger_archive_lock          string  replica id of the archiver at work (PX)
    {p}usage_hours                  zset    "{hour}:{tenant}" by hour: the hours with sums
    {p}usage_sums:{tenant}:{hour}   hash    "{model}\x1f{backend}\x1f{region}\x1f{status}\x1f{version}\x1e{i}" -> sum i
    {p}usage_latency:{tenant}:{hour} hash   "t{µs}" / "i{µs}" -> records with that time to first token / token gap
    {p}usage_hours_since            string  the first hour whose sums are complete
    {p}cache:{tenant_id}:{key}      string  a response cache entry (PX its TTL; cache.py)
    {p}cache_index                  zset    "{tenant_id}:{key}" -> expiry (ms, Redis clock)
    {p}cache_sizes                  hash    "{tenant_id}:{key}" -> bytes counted against cache_max_bytes
    {p}cache_bytes                  string  their sum
    {p}batch...                     the batch queue's keys (their layout in queue.py)
"""

from __future__ import annotations

import json

from gateway.store.models import ApiKey, Tenant


class KeyNames:
    def __init__(self, prefix: str) -> None:
        self.p = prefix

    def tenant(self, tenant_id: str) -> str:
        return f"{self.p}tenant:{tenant_id}"

    def tenants(self) -> str:
        return f"{self.p}tenants"

    def account(self, account_id: str) -> str:
        return f"{self.p}account:{account_id}"

    def apikey(self, key_hash: str) -> str:
        return f"{self.p}apikey:{key_hash}"

    def apikey_id(self, key_id: str) -> str:
        return f"{self.p}apikey_id:{key_id}"

    def tenant_keys(self, tenant_id: str) -> str:
        return f"{self.p}tenant_keys:{tenant_id}"

    def limit_scope(self, key_id: str, which: str) -> str:
        return f"{self.p}rl:{key_id}:{which}"

    def budget(self, tenant_id: str, month: str) -> str:
        return f"{self.p}budget:{tenant_id}:{month}"

    def budget_token(self, token: str) -> str:
        return f"{self.p}budget_token:{token}"

    def secret(self, name: str) -> str:
        return f"{self.p}secret:{name}"

    def session(self, tenant_id: str, session_id: str) -> str:
        return f"{self.p}session:{tenant_id}:{session_id}"

    def prefix_hash(self, block_hash: int | str = "") -> str:
        return f"{self.p}prefix:{block_hash}"

    def prefix_lru(self) -> str:
        return f"{self.p}prefix_lru"

    def inflight(self, replica_id: str = "", kind: str = "") -> str:
        return f"{self.p}inflight:{replica_id}:{kind}" if kind else f"{self.p}inflight:"

    def request_slots(self, tenant_id: str) -> str:
        return f"{self.p}slots:{tenant_id}"

    def inflight_replicas(self) -> str:
        return f"{self.p}inflight_replicas"

    def ledger(self) -> str:
        return f"{self.p}ledger"

    def ledger_request(self, request_id: str) -> str:
        return f"{self.p}ledger_req:{request_id}"

    def ledger_archive(self, what: str) -> str:
        """"archived_before", "archive_id" or "archive_lock"."""
        return f"{self.p}ledger_{what}"

    def ledger_by_time(self, tenant_id: str | None = None) -> str:
        return f"{self.p}ledger_by_time" if tenant_id is None else f"{self.p}ledger_by_time:{tenant_id}"


    def usage_hour(self, kind: str, tenant_id: str, hour: int) -> str:
        """kind: "sums" or "latency"."""
        return f"{self.p}usage_{kind}:{tenant_id}:{hour}"

    def usage_hours(self) -> str:
        return f"{self.p}usage_hours"

    def usage_hours_since(self) -> str:
        return f"{self.p}usage_hours_since"

    def cache(self, what: str = "") -> str:
        """The prefix of entries' names ("") or "index", "sizes", "bytes"."""
        return f"{self.p}cache_{what}" if what else f"{self.p}cache:"


def ledger_member(ended_us: int, request_id: str) -> str:
    """The time index's ordering part of a member (the stream id follows after a NUL)."""
    return f"{ended_us:016d}:{request_id}"


def parse_member(member: str) -> tuple[int, str, str | None]:
    """(ended_us, request_id, stream id or None for members written before it was kept there)."""
    ended, _, rest = member.partition(":")
    request_id, sep, stream_id = rest.partition("\0")
    return int(ended), request_id, stream_id if sep else None


def _models_out(models: frozenset[str] | None) -> dict[str, str]:
    return {} if models is None else {"allowed_models": json.dumps(sorted(models))}


def _models_in(fields: dict[str, str]) -> frozenset[str] | None:
    text = fields.get("allowed_models")
    return None if text is None else frozenset(json.loads(text))


def _int_in(fields: dict[str, str], name: str) -> int | None:
    return None if name not in fields else int(fields[name])


def encode_tenant(tenant: Tenant) -> dict[str, str]:
    fields = {"name": tenant.name, "account_ids": json.dumps(tenant.account_ids), "created_at": repr(tenant.created_at)}
    for name in ("monthly_budget_micro", "max_concurrent_requests"):
        if getattr(tenant, name) is not None:
            fields[name] = str(getattr(tenant, name))
    return fields | _models_out(tenant.allowed_models)


def decode_tenant(tenant_id: str, fields: dict[str, str]) -> Tenant:
    return Tenant(
        id=tenant_id, name=fields["name"], account_ids=tuple(json.loads(fields["account_ids"])),
        allowed_models=_models_in(fields), monthly_budget_micro=_int_in(fields, "monthly_budget_micro"),
        created_at=float(fields["created_at"]), max_concurrent_requests=_int_in(fields, "max_concurrent_requests"),
    )


def encode_key(key: ApiKey, key_hash: str) -> dict[str, str]:
    fields = {"id": key.id, "tenant_id": key.tenant_id, "prefix": key.prefix, "hash": key_hash,
              "created_at": repr(key.created_at)}
    for name in ("rpm", "tpm"):
        if getattr(key, name) is not None:
            fields[name] = str(getattr(key, name))
    return fields | _models_out(key.allowed_models)


def decode_key(fields: dict[str, str]) -> ApiKey:
    revoked = fields.get("revoked_at")
    return ApiKey(
        id=fields["id"], tenant_id=fields["tenant_id"], prefix=fields["prefix"], allowed_models=_models_in(fields),
        rpm=_int_in(fields, "rpm"), tpm=_int_in(fields, "tpm"), created_at=float(fields["created_at"]),
        revoked_at=None if revoked is None else float(revoked),
    )
