"""Who is calling and what they may do: API key -> tenant, account and model checks, requests per minute.

`Authenticator.authenticate` turns the `Authorization: Bearer <key>` header into a `Principal`
(key + tenant, one store call) and checks the tenant owns the account in the URL. `authorize_model`
applies the tenant's and the key's model allow-lists. `admit_request` counts the request against
the key's requests-per-minute as soon as the key is known, before its body is read or parsed (so
a request later refused as invalid still counts, and a key over its limit costs the gateway no
parsing or tokenizing), in the shared store (atomic across gateway replicas, on the store's clock,
so replicas whose clocks disagree still share one window), refusing with 429 + Retry-After when
used up. Its token estimate is counted against tokens-per-minute with the rest of its admission,
once it is tokenized (gateway/pipeline/ticket.py). The dashboard API counts its calls against the
same requests-per-minute (`admit_key_request`).
"""

from __future__ import annotations

from gateway.context import Principal
from gateway.errors import AccountMismatch, AuthenticationFailed, ModelNotAllowed, RateLimited
from gateway.store.factory import Store
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
        found = await self.store.tenancy.authenticate(secret)
        if found is None:
            raise AuthenticationFailed("Authentication error: the API key is unknown or revoked")
        key, tenant = found
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
        if key.rpm is None:
            return
        decision = await self.store.admission.check_and_consume(key.id, key.rpm, None, 0)
        if not decision.allowed:
            raise RateLimited(
                f"Rate limited: this API key allows {key.rpm} requests per minute; "
                f"retry in {decision.retry_after_s:.1f}s",
                retry_after_s=decision.retry_after_s,
            )
