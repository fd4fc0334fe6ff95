"""Tenants' LoRA finetunes: create, upload their PEFT files, list, delete, and resolve one for a request.

A finetune is created for a base model that accepts adapters (`ModelSpec.lora`), then its two files are
uploaded (`adapter_config.json`, `adapter_model.safetensors`), each checked on arrival
(`contracts.lora_adapter`: LoRA only, rank <= 32, targets the engine serves, every tensor's shape the base
model's, at most `finetune_max_bytes`) and written to `finetunes_dir/<finetune id>/`, the directory the
backends load adapters from (their `lora_dir`). Metadata is the store's (`store.adapters`), at most
`finetunes_per_account` per account. A request names a finetune by name or id of its own account only:
another account's is "not found", exactly like a missing one. The backend is asked for the adapter by
its id (vLLM's convention: the adapter's name as the model), and the prefix chain is salted with it.
Deleting a finetune removes its metadata and files, then unloads it from its model's backends
(adapter_unload.py; a backend that cannot be told does not fail the delete).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from contracts.lora_adapter import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterConfig,
    AdapterError,
    BaseShape,
    check_tensors,
    parse_config,
)
from gateway.context import Principal
from gateway.errors import InvalidInput, ModelNotFound
from gateway.fleet.catalog import Catalog, ModelSpec
from gateway.pipeline.adapter_unload import AdapterUnloader
from gateway.pipeline.settings import FinetuneSettings
from gateway.store.adapters import Adapters, Finetune, new_finetune
from gateway.store.errors import Conflict, NotFound

ASSETS = (CONFIG_FILE, WEIGHTS_FILE)
SAFETENSORS_DTYPES = {"F32", "F16", "BF16"}


class Finetunes:
    def __init__(self, adapters: Adapters, catalog: Catalog, settings: FinetuneSettings, unloader: AdapterUnloader) -> None:
        self.adapters = adapters
        self.catalog = catalog
        self.settings = settings
        self.unloader = unloader

    @property
    def directory(self) -> Path:
        if self.settings.finetunes_dir is None:
            raise InvalidInput("this gateway keeps no finetunes: its operator sets finetunes_dir (EDGERUN_FINETUNES_DIR)")
        return Path(self.settings.finetunes_dir)

    async def create(self, principal: Principal, body: dict[str, Any]) -> Finetune:
        """`{model, name, description}` -> the new finetune (400 for a model without adapters, a taken name, the cap)."""
        self.directory  # noqa: B018  (refuses early when finetunes are off)
        model_id, name, description = body.get("model"), body.get("name"), body.get("description", "")
        if not isinstance(model_id, str) or not model_id:
            raise InvalidInput("model must name the base model, e.g. @cf/huggingface/smollm2-135m-instruct", param="model")
        model = self.catalog.get(model_id)
        if model.lora is None:
            raise InvalidInput(f"{model.id} does not accept LoRA adapters: list those that do with "
                               "GET .../ai/models/search?capabilities=LoRA", param="model")
        if not isinstance(name, str) or not 0 < len(name) <= 128 or ":" in name or name != name.strip():
            raise InvalidInput("name must be 1-128 characters without ':' or surrounding spaces", param="name")
        if not isinstance(description, str) or len(description) > 1024:
            raise InvalidInput("description must be a string of at most 1024 characters", param="description")
        finetune = new_finetune(principal.account_id, name, model.id, description)
        try:
            await self.adapters.create_finetune(finetune, self.settings.finetunes_per_account)
        except Conflict as exc:
            raise InvalidInput(str(exc), param="name") from exc
        return finetune

    async def list(self, principal: Principal) -> list[Finetune]:
        return await self.adapters.list_finetunes(principal.account_id)

    async def upload(self, principal: Principal, finetune_id: str, file_name: str, data: bytes) -> Finetune:
        """Check one PEFT file against the finetune's base model (and its other file, if in) and keep it."""
        finetune = await self._own(principal, finetune_id)
        if file_name not in ASSETS:
            raise InvalidInput(f"file_name must be {CONFIG_FILE} or {WEIGHTS_FILE}, got {file_name!r}", param="file_name")
        if len(data) > self.settings.finetune_max_bytes:
            raise InvalidInput(f"{file_name} has {len(data)} bytes; an adapter file may have at most "
                               f"{self.settings.finetune_max_bytes}", param="file")
        model = self.catalog.get(finetune.model)
        assert model.lora is not None, "create() only makes finetunes of models that take adapters"
        try:  # reads the other file and writes this one: off the event loop
            await asyncio.to_thread(_check_and_keep, self.directory / finetune.id, file_name, data, model.lora.base_shape())
        except AdapterError as exc:
            raise InvalidInput(f"{file_name}: {exc}", param="file") from exc
        try:
            return await self.adapters.add_asset(principal.account_id, finetune.id, file_name)
        except NotFound as exc:  # deleted meanwhile
            raise ModelNotFound(f"no finetune {finetune_id} in this account", param="finetune_id") from exc

    async def delete(self, principal: Principal, finetune_id: str) -> None:
        finetune = await self._own(principal, finetune_id)
        if not await self.adapters.delete_finetune(principal.account_id, finetune.id):
            raise ModelNotFound(f"no finetune {finetune_id} in this account", param="finetune_id")
        await asyncio.to_thread(shutil.rmtree, self.directory / finetune.id, True)
        await self.unloader.unload(finetune.model, finetune.id)

    async def resolve(self, principal: Principal, model: ModelSpec, lora: str | None) -> Finetune | None:
        """The finetune a request's `lora` names (by name or id, in the caller's account), None without one."""
        if lora is None:
            return None
        if model.lora is None:
            raise InvalidInput(f"{model.id} does not accept LoRA adapters", param="lora")
        finetune = await self.adapters.get_finetune(principal.account_id, lora)
        if finetune is None:
            raise ModelNotFound(f"no finetune {lora!r} in this account: create it and upload its files first", param="lora")
        if finetune.model != model.id:
            raise InvalidInput(f"finetune {lora!r} adapts {finetune.model}, not {model.id}: call it on its base model",
                               param="lora")
        if not finetune.is_complete:
            raise InvalidInput(f"finetune {lora!r} lacks {', '.join(sorted(set(ASSETS) - set(finetune.assets)))}: "
                               "upload it first", param="lora")
        return finetune

    async def _own(self, principal: Principal, finetune_id: str) -> Finetune:
        finetune = await self.adapters.get_finetune(principal.account_id, finetune_id)
        if finetune is None or finetune.id != finetune_id:
            raise ModelNotFound(f"no finetune {finetune_id} in this account", param="finetune_id")
        return finetune


def render(finetune: Finetune) -> dict[str, Any]:
    """Workers AI's finetune object."""
    created = _iso(finetune.created_at)
    return {"id": finetune.id, "name": finetune.name, "description": finetune.description, "model": finetune.model,
            "created_at": created, "modified_at": created, "public": False}


def _iso(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _check_and_keep(folder: Path, file_name: str, data: bytes, base: BaseShape) -> None:
    """Check `data` (and, with the other file in `folder`, the pair) and write it there; AdapterError if bad."""
    config = _config(data) if file_name == CONFIG_FILE else _read_config(folder)
    shapes = _tensor_shapes(data) if file_name == WEIGHTS_FILE else _read_shapes(folder)
    if config is not None and shapes is not None:
        check_tensors(config, shapes, base)
    _write_atomically(folder / file_name, data)


def _config(data: bytes) -> AdapterConfig:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise AdapterError(f"not valid JSON: {exc}") from exc
    return parse_config(raw)


def _read_config(folder: Path) -> AdapterConfig | None:
    path = folder / CONFIG_FILE
    return _config(path.read_bytes()) if path.is_file() else None


def _tensor_shapes(data: bytes, header_only: bool = False) -> dict[str, tuple[int, ...]]:
    """The tensors' names and shapes from a safetensors file's header (8 bytes of length, then JSON);
    `header_only`: `data` stops after the header (offsets are not checked against the data)."""
    if len(data) < 8:
        raise AdapterError("not a safetensors file (too short)")
    (length,) = struct.unpack("<Q", data[:8])
    if not 2 <= length <= len(data) - 8:
        raise AdapterError("not a safetensors file (bad header length)")
    try:
        header = json.loads(data[8 : 8 + length])
    except ValueError as exc:
        raise AdapterError(f"not a safetensors file (header: {exc})") from exc
    if not isinstance(header, dict):
        raise AdapterError("not a safetensors file (header is not an object)")
    shapes: dict[str, tuple[int, ...]] = {}
    body = None if header_only else len(data) - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPES:
            raise AdapterError(f"tensor {name!r}: dtype must be one of {sorted(SAFETENSORS_DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1]
                and (body is None or offsets[1] <= body)):
            raise AdapterError(f"tensor {name!r}: bad shape or offsets")
        shapes[name] = tuple(shape)
    return shapes


def _read_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        return None
    with path.open("rb") as f:  # the header only
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        return _tensor_shapes(head + f.read(length), header_only=True)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
