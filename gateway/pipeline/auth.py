"""Who is calling and what they may do: API key -> tenant, account and model checks, rate limits.

`Authenticator.authenticate` turns the `Authorization: Bearer <key>` header into a `Principal`
(key + tenant) and checks the tenant owns the account in the URL. `authorize_model` applies the
tenant's and the key's model allow-lists. Limits are counted in the shared store (atomic across
gateway replicas, on the store's clock, so replicas whose clocks disagree still share one window)
and refuse with 429 + Retry-After when used up, in two steps: `admit_request` counts the request
against requests-per-minute as soon as the key is known, before its body is read or parsed (so a
request later refused as invalid still counts, and a key over its limit costs the gateway no
parsing or tokenizing); `admit_tokens` counts its token estimate against tokens-per-minute once it
is tokenized. `admit` does both at once. The dashboard API counts its calls against the same
requests-per-minute (`admit_key_request`).
"""

from __future__ import annotations

from gateway.context import Principal
from gateway.errors import AccountMismatch, AuthenticationFailed, ModelNotAllowed, RateLimited, RequestTooLarge
from gateway.store.base import Store
from gateway.store.errors import TokensOverLimit
from gateway.store.models import ApiKey


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Authenticator:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def authenticate(self, authorization: str | None, account_id: str) -> Principal:
        secret = bearer_token(authorization)
        if secret is None:
            raise AuthenticationFailed("Authentication error: send the API key as 'Authorization: Bearer <key>'")
        key = await self.store.lookup_key(secret)
        tenant = await self.store.get_tenant(key.tenant_id) if key is not None else None
        if key is None or tenant is None:
            raise AuthenticationFailed("Authentication error: the API key is unknown or revoked")
        if account_id not in tenant.account_ids:
            raise AccountMismatch(f"Authentication error: this API key cannot be used with account {account_id}")
        return Principal(key=key, tenant=tenant, account_id=account_id)

    @staticmethod
    def authorize_model(principal: Principal, model_id: str) -> None:
        if not principal.tenant.allows_model(model_id) or not principal.key.allows_model(model_id):
            raise ModelNotAllowed(f"The account is not allowed to access this model: {model_id}", param="model")

    async def admit_request(self, principal: Principal) -> None:
        """Count one request against the key's requests-per-minute, or refuse it (nothing counted)."""
        await self.admit_key_request(principal.key)

    async def admit_key_request(self, key: ApiKey) -> None:
        """As `admit_request`, for a caller that is not tied to an account (the dashboard API)."""
        if key.rpm is not None:
            await self._consume(key, key.rpm, None, 0)

    async def admit_tokens(self, principal: Principal, tokens_estimate: int) -> None:
        """Count the token estimate against the key's tokens-per-minute, or refuse it (nothing counted)."""
        if principal.key.tpm is not None:
            await self._consume(principal.key, None, principal.key.tpm, tokens_estimate)

    async def admit(self, principal: Principal, tokens_estimate: int) -> None:
        """Both limits in one atomic step (one request and its tokens), or refuse (nothing counted)."""
        if principal.key.rpm is not None or principal.key.tpm is not None:
            await self._consume(principal.key, principal.key.rpm, principal.key.tpm, tokens_estimate)

    async def _consume(self, key: ApiKey, rpm: int | None, tpm: int | None, tokens_estimate: int) -> None:
        try:
            decision = await self.store.check_and_consume(key.id, rpm, tpm, tokens_estimate)
        except TokensOverLimit as exc:
            raise RequestTooLarge(str(exc), param="max_tokens") from exc
        if not decision.allowed:
            limit = {"rpm": f"{key.rpm} requests", "tpm": f"{key.tpm} tokens"}.get(decision.which or "", "its limit")
            raise RateLimited(
                f"Rate limited: this API key allows {limit} per minute; retry in {decision.retry_after_s:.1f}s",
                retry_after_s=decision.retry_after_s,
            )

    async def reconcile(self, principal: Principal, estimate: int, actual: int) -> None:
        """Replace the token estimate counted at admission with what the request really used."""
        if principal.key.tpm is not None and estimate != actual:
            await self.store.reconcile_tokens(principal.key.id, estimate, actual)
