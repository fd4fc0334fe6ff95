"""Build the store the settings ask for."""

from __future__ import annotations

from gateway.store.base import Store
from gateway.store.settings import StoreSettings


def open_store(settings: StoreSettings) -> Store:
    """`RedisStore` when `settings.redis_url` is set; else, on `settings.sqlite_path`,
    `SharedEmbeddedStore` when several processes serve from the file (`sqlite_shared`, which
    GatewaySettings turns on for `workers > 1`), `EmbeddedStore` otherwise.

    Call it inside the app's lifespan and `await store.aclose()` when it ends. Redis connects on
    first use, so a wrong URL shows up as StoreUnavailable on the first call.
    """
    if settings.redis_url:
        from gateway.store.redis_store import RedisStore

        return RedisStore(settings)
    if settings.sqlite_shared:
        from gateway.store.embedded_shared import SharedEmbeddedStore

        return SharedEmbeddedStore(settings)
    from gateway.store.embedded import EmbeddedStore

    return EmbeddedStore(settings)
