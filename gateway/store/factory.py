"""Build the store the settings ask for."""

from __future__ import annotations

from gateway.settings import GatewaySettings
from gateway.store.base import Store


def open_store(settings: GatewaySettings) -> Store:
    """`RedisStore` when `settings.redis_url` is set, else `EmbeddedStore` on `settings.sqlite_path`.

    Call it inside the app's lifespan and `await store.aclose()` when it ends. Redis connects on
    first use, so a wrong URL shows up as StoreUnavailable on the first call.
    """
    if settings.redis_url:
        from gateway.store.redis_store import RedisStore

        return RedisStore(settings)
    from gateway.store.embedded import EmbeddedStore

    return EmbeddedStore(settings)
