"""Tenants of an in-process gateway speaking the finetunes API, for the finetune tests on the built-in
backend (tests/gateway/e2e/test_finetunes_e2e.py) and on a real vLLM (tests/vllm/test_vllm_lora.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.gateway.fixtures_e2e import InProcessGateway

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
T = TypeVar("T", bound="FinetuneTenant")


class FinetuneTenant:
    """A tenant with its own account and key; `model` is the base model its finetunes and calls name."""

    def __init__(self, gateway: InProcessGateway, name: str, model: str, timeout_s: float = 60) -> None:
        self.account = f"acct-{name}"
        self.model = model
        secret = gateway.new_key(f"tenant-{name}", self.account)
        self.client = httpx.Client(base_url=f"{gateway.url}/client/v4/accounts/{self.account}",
                                   headers={"authorization": f"Bearer {secret}"}, timeout=timeout_s)

    def create(self, name: str, model: str | None = None) -> httpx.Response:
        return self.client.post("/ai/finetunes", json={"model": model or self.model, "name": name, "description": "test"})

    def upload(self, finetune_id: str, file_name: str, data: bytes) -> httpx.Response:
        return self.client.post(f"/ai/finetunes/{finetune_id}/finetune-assets",
                                files={"file": (file_name, data)}, data={"file_name": file_name})

    def upload_dir(self, finetune_id: str, directory: Path) -> None:
        for file_name in ADAPTER_FILES:
            answer = self.upload(finetune_id, file_name, (directory / file_name).read_bytes())
            assert answer.status_code == 200, answer.text

    def create_and_upload(self, name: str, directory: Path) -> str:
        """A new finetune of the base model holding `directory`'s adapter: its id."""
        created = self.create(name)
        assert created.status_code == 200, created.text
        finetune_id: str = created.json()["result"]["id"]
        self.upload_dir(finetune_id, directory)
        return finetune_id

    def run(self, prompt: str, max_tokens: int, lora: str | None = None) -> httpx.Response:
        """A greedy, raw completion of the base model (under finetune `lora`, by name or id, when given)."""
        body: dict[str, Any] = {"prompt": prompt, "raw": True, "max_tokens": max_tokens, "temperature": 0}
        if lora is not None:
            body["lora"] = lora
        return self.client.post(f"/ai/run/{self.model}", json=body)


@contextmanager
def finetune_tenants(gateway: InProcessGateway, model: str, kind: type[T], timeout_s: float = 60
                     ) -> Iterator[Callable[[str], T]]:
    """Makes tenants (of `kind`, a FinetuneTenant) by name; their clients are closed at the end."""
    made: list[T] = []

    def make(name: str) -> T:
        made.append(kind(gateway, name, model, timeout_s))
        return made[-1]

    try:
        yield make
    finally:
        for tenant in made:
            tenant.client.close()
