"""Which LoRA adapters each backend has loaded, for the kinds that load them at runtime (vLLM).

A vLLM server started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` serves an
adapter as the model of its name once `POST /v1/load_lora_adapter {lora_name, lora_path}` loaded it.
`ResidentAdapters` remembers the (endpoint, adapter) pairs this process loaded, so each is loaded
once per server; concurrent first requests for one pair wait on one load. A server that restarted has
forgotten its adapters: the client sees its 404 ("The model `X` does not exist"), calls `forget`, and
loads the adapter again (client.py). A server that already had it ("has already been loaded": another
gateway replica loaded it, or this one restarted) counts as loaded.

When a finetune is deleted, `POST /v1/unload_lora_adapter {lora_name}` (vLLM's, and the built-in backend's
too) frees it on each server; one that does not have it ("cannot be found", 404) counts as unloaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from backends.client.types import Endpoint

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
NOT_LOADED = "cannot be found"  # vLLM's answer (404, 400 in older versions) for a name it does not have
ALREADY_LOADED = "has already been loaded"  # vLLM's 400 for a name it has: loaded, as far as we are concerned
ENABLE_HINT = ("start vLLM with --enable-lora --max-lora-rank 32 and the environment's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, "
               "and give the backend lora_dir (the finetunes directory as that server reads it)")


class ResidentAdapters:
    """The adapters loaded on each endpoint by this process; `ensure` loads one that is not."""

    def __init__(self) -> None:
        self._loaded: set[tuple[str, str]] = set()  # (endpoint id, adapter name)
        self._loading: dict[tuple[str, str], asyncio.Future[None]] = {}

    def is_loaded(self, endpoint: Endpoint, name: str) -> bool:
        return (endpoint.id, name) in self._loaded

    async def ensure(self, endpoint: Endpoint, name: str, load: Callable[[], Awaitable[None]]) -> None:
        """Run `load` unless `name` is loaded on `endpoint` (or being loaded: then wait for that load);
        its error reaches every waiter, and the next request tries again."""
        key = (endpoint.id, name)
        if key in self._loaded:
            return
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            await load()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        else:
            self._loaded.add(key)
            future.set_result(None)
        finally:
            del self._loading[key]

    def forget(self, endpoint: Endpoint, name: str) -> None:
        """The server no longer has `name` (it restarted, or it was unloaded): the next `ensure` loads it again."""
        self._loaded.discard((endpoint.id, name))


def adapter_path(endpoint: Endpoint, name: str) -> str | None:
    """Where `endpoint`'s server reads adapter `name` (None: the backend has no `lora_dir`)."""
    return None if endpoint.lora_dir is None else f"{endpoint.lora_dir.rstrip('/')}/{name}"
