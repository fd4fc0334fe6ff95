"""A tenant's LoRA finetune served by a real vLLM through the gateway (the session's server,
tests/vllm/fixtures.py, started with `--enable-lora` and runtime loading).

A random PEFT adapter for SmolLM2 (large enough B weights to change a greedy answer) is uploaded
through the finetunes API into the gateway's finetunes directory, which is the vLLM backend's
`lora_dir`; the gateway loads it on the server under the finetune's id and calls it by that name.
Its greedy answer differs from the base model's and is the same twice; another tenant naming it gets
404; a server that has lost it (unloaded here, as a restart would) gets it loaded again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.builtin.runner.model_config import ModelConfig
from tests.engines.lora_files import write_adapter
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.vllm.fixtures import VLLM_API_KEY, VLLM_BACKEND_ID, VLLM_MODEL_ID, vllm_model_spec
from tests.vllm.server import VllmProcess

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
SMOLLM2_LORA = {"num_layers": 30, "hidden_size": 576, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64,
                "intermediate_size": 1536}


@pytest.fixture(scope="module")
def finetunes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("finetunes")


@pytest.fixture(scope="module")
def gateway(
    vllm_server: VllmProcess, vllm_checkpoint: Path, finetunes_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    """A gateway keeping finetunes in `finetunes_dir`, which the vLLM backend reads too (one machine)."""
    backend = {**vllm_server.spec(VLLM_BACKEND_ID, [VLLM_MODEL_ID]), "lora_dir": str(finetunes_dir)}
    settings = gateway_settings(tmp_path_factory.mktemp("vllm-lora-gateway"), [backend],
                                models=[{**vllm_model_spec(vllm_checkpoint), "lora": SMOLLM2_LORA}],
                                backend_api_key=VLLM_API_KEY, finetunes_dir=finetunes_dir)
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


@pytest.fixture
def tenants(gateway: InProcessGateway) -> Iterator[Callable[[str], Tenant]]:
    made: list[Tenant] = []

    def make(name: str) -> Tenant:
        made.append(Tenant(gateway, name))
        return made[-1]

    yield make
    for tenant in made:
        tenant.client.close()


class Tenant:
    def __init__(self, gateway: InProcessGateway, name: str) -> None:
        self.account = f"acct-{name}"
        secret = gateway.new_key(f"tenant-{name}", self.account)
        self.client = httpx.Client(base_url=f"{gateway.url}/client/v4/accounts/{self.account}",
                                   headers={"authorization": f"Bearer {secret}"}, timeout=120)

    def upload(self, name: str, directory: Path) -> str:
        created = self.client.post("/ai/finetunes", json={"model": VLLM_MODEL_ID, "name": name})
        assert created.status_code == 200, created.text
        finetune_id: str = created.json()["result"]["id"]
        for file_name in ("adapter_config.json", "adapter_model.safetensors"):
            answer = self.client.post(f"/ai/finetunes/{finetune_id}/finetune-assets",
                                      files={"file": (file_name, (directory / file_name).read_bytes())},
                                      data={"file_name": file_name})
            assert answer.status_code == 200, answer.text
        return finetune_id

    def run(self, lora: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"prompt": PROMPT, "raw": True, "max_tokens": 12, "temperature": 0}
        if lora is not None:
            body["lora"] = lora
        return self.client.post(f"/ai/run/{VLLM_MODEL_ID}", json=body)

    def answer(self, lora: str | None = None) -> str:
        response = self.run(lora)
        assert response.status_code == 200, response.text
        text: str = response.json()["result"]["response"]
        return text


def random_adapter(directory: Path, checkpoint: Path) -> Path:
    """Rank 8 on q and v of every layer, named as the exported checkpoint names its modules."""
    config = ModelConfig.from_hf(json.loads((checkpoint / "config.json").read_text()))
    return write_adapter(directory, config, rank=8, targets=("q_proj", "v_proj"), seed=3, std=0.1)


def test_finetune_is_loaded_on_vllm_and_called_by_name(
    tenants: Callable[[str], Tenant], vllm_server: VllmProcess, vllm_checkpoint: Path, tmp_path: Path
) -> None:
    acme, beta = tenants("acme"), tenants("beta")
    finetune_id = acme.upload("noisy", random_adapter(tmp_path / "noisy", vllm_checkpoint))

    base = acme.answer()
    tuned = acme.answer("noisy")
    assert tuned != base, (tuned, base)  # the adapter ran, not the base model
    assert acme.answer(finetune_id) == tuned  # by id too, and greedy: the same answer again
    assert finetune_id in served(vllm_server)  # vLLM has it under the finetune's id

    for name_or_id in ("noisy", finetune_id):  # another tenant cannot name it
        refused = beta.run(name_or_id)
        assert refused.status_code == 404 and "no finetune" in refused.json()["errors"][0]["message"]

    # the server forgets it (as a restart would): its 404 makes the gateway load it again
    unloaded = httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": finetune_id},
                          headers={"authorization": f"Bearer {VLLM_API_KEY}"}, timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    assert finetune_id not in served(vllm_server)
    assert acme.answer("noisy") == tuned
    assert finetune_id in served(vllm_server)
    assert acme.answer() == base  # and the base model is still itself


def served(server: VllmProcess) -> list[str]:
    """The model names vLLM serves now: its base model and the adapters it has loaded."""
    models = httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {VLLM_API_KEY}"}, timeout=30)
    return [m["id"] for m in models.json()["data"]]
