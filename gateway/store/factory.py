"""Build the store the settings ask for."""

from __future__ import annotations

from gateway.store.base import Store
from gateway.store.settings import StoreSettings


def open_store(settings: StoreSettings) -> Store:
    """The first that applies:
    - `RedisStore` when `settings.redis_url` is set;
    - `HostedStore` when `settings.store_socket` is set: calls go to the store host on this machine
      (gateway/store/host/), which keeps one `EmbeddedStore` for all the workers;
    - on `settings.sqlite_path`, `SharedEmbeddedStore` when several processes serve from the file
      (`sqlite_shared`: chosen, or a `--workers` worker given no host), `EmbeddedStore` otherwise.

    Call it inside the app's lifespan and `await store.aclose()` when it ends. Redis and the store
    host are connected on first use, so a wrong URL or socket shows up as StoreUnavailable on the
    first call.
    """
    if settings.redis_url:
        from gateway.store.redis_store import RedisStore

        return RedisStore(settings)
    if settings.store_socket:
        from gateway.store.host.client import HostedStore

        return HostedStore(settings)
    if settings.sqlite_shared:
        from gateway.store.embedded_shared import SharedEmbeddedStore

        return SharedEmbeddedStore(settings)
    from gateway.store.embedded import EmbeddedStore

    return EmbeddedStore(settings)
