"""Adapters: tenants' LoRA fine-tunes (Workers AI's "finetunes"), their metadata only.

A finetune belongs to one account (so to its tenant), names its base model, and lists the PEFT files
uploaded for it (`assets`); the files themselves live in the gateway's adapter directory, which the
backends read (gateway/pipeline/finetunes.py). A name is unique within its account; an account holds at
most `max_per_account` finetunes. Two implementations pass the same tests: `local.adapters.LocalAdapters`
(the SQLite file) and `redis.adapters.RedisAdapters` (one hash per finetune and an index per account,
created and deleted by Lua scripts, so two replicas never both take the last place or the same name).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Finetune:
    id: str
    account_id: str
    name: str
    model: str  # the base model's catalog id
    description: str = ""
    created_at: float = field(default_factory=time.time)
    assets: tuple[str, ...] = ()  # the PEFT files uploaded so far, sorted

    @property
    def is_complete(self) -> bool:
        """Both PEFT files are in: the finetune can be called."""
        return {"adapter_config.json", "adapter_model.safetensors"} <= set(self.assets)

    def with_asset(self, file_name: str) -> Finetune:
        return replace(self, assets=tuple(sorted({*self.assets, file_name})))

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "account_id": self.account_id, "name": self.name, "model": self.model,
                           "description": self.description, "created_at": self.created_at, "assets": list(self.assets)})

    @classmethod
    def from_json(cls, text: str) -> Finetune:
        data: dict[str, Any] = json.loads(text)
        return cls(data["id"], data["account_id"], data["name"], data["model"], data["description"],
                   data["created_at"], tuple(data["assets"]))


def new_finetune(account_id: str, name: str, model: str, description: str = "") -> Finetune:
    return Finetune(str(uuid.uuid4()), account_id, name, model, description)


class Adapters(Protocol):
    async def create_finetune(self, finetune: Finetune, max_per_account: int) -> None:
        """Add `finetune`; raises Conflict when its account already has one of that name or holds
        `max_per_account` (nothing is written then)."""
        ...

    async def get_finetune(self, account_id: str, name_or_id: str) -> Finetune | None:
        """The account's finetune with that id, else with that name; None if it has none."""
        ...

    async def list_finetunes(self, account_id: str) -> list[Finetune]:
        """The account's finetunes, oldest first."""
        ...

    async def add_asset(self, account_id: str, finetune_id: str, file_name: str) -> Finetune:
        """Record that `file_name` was uploaded; raises NotFound if the account has no such finetune."""
        ...

    async def delete_finetune(self, account_id: str, finetune_id: str) -> bool:
        """Remove it; False if the account had no such finetune."""
        ...
