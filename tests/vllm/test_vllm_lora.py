"""A tenant's LoRA finetune served by a real vLLM through the gateway (the session's server,
tests/vllm/fixtures.py, started with `--enable-lora` and runtime loading).

A random PEFT adapter for SmolLM2 (large enough B weights to change a greedy answer) is uploaded
through the finetunes API into the gateway's finetunes directory, which is the vLLM backend's
`lora_dir`; the gateway loads it on the server under the finetune's id and calls it by that name.
Its greedy answer differs from the base model's and is the same twice; another tenant naming it gets
404; a server that has lost it (unloaded here, as a restart would) gets it loaded again. Deleting the
finetune unloads it from the server, and a new finetune of the same name serves its own weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from engines.builtin.runner.model_config import ModelConfig
from tests.engines.lora_files import write_adapter
from tests.gateway.finetune_tenants import FinetuneTenant, finetune_tenants
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
    with finetune_tenants(gateway, VLLM_MODEL_ID, Tenant, timeout_s=120) as make:
        yield make


class Tenant(FinetuneTenant):
    def ask(self, lora: str | None = None) -> httpx.Response:
        return self.run(PROMPT, 12, lora)

    def answer(self, lora: str | None = None) -> str:
        response = self.ask(lora)
        assert response.status_code == 200, response.text
        text: str = response.json()["result"]["response"]
        return text


def random_adapter(directory: Path, checkpoint: Path, seed: int = 3) -> Path:
    """Rank 8 on q and v of every layer, named as the exported checkpoint names its modules."""
    config = ModelConfig.from_hf(json.loads((checkpoint / "config.json").read_text()))
    return write_adapter(directory, config, rank=8, targets=("q_proj", "v_proj"), seed=seed, std=0.1)


def test_finetune_is_loaded_on_vllm_and_called_by_name(
    tenants: Callable[[str], Tenant], vllm_server: VllmProcess, vllm_checkpoint: Path, tmp_path: Path
) -> None:
    acme, beta = tenants("acme"), tenants("beta")
    finetune_id = acme.create_and_upload("noisy", random_adapter(tmp_path / "noisy", vllm_checkpoint))

    base = acme.answer()
    tuned = acme.answer("noisy")
    assert tuned != base, (tuned, base)  # the adapter ran, not the base model
    assert acme.answer(finetune_id) == tuned  # by id too, and greedy: the same answer again
    assert finetune_id in served(vllm_server)  # vLLM has it under the finetune's id

    for name_or_id in ("noisy", finetune_id):  # another tenant cannot name it
        refused = beta.ask(name_or_id)
        assert refused.status_code == 404 and "no finetune" in refused.json()["errors"][0]["message"]

    # the server forgets it (as a restart would): its 404 makes the gateway load it again
    unloaded = httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": finetune_id},
                          headers={"authorization": f"Bearer {VLLM_API_KEY}"}, timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    assert finetune_id not in served(vllm_server)
    assert acme.answer("noisy") == tuned
    assert finetune_id in served(vllm_server)
    assert acme.answer() == base  # and the base model is still itself


def test_delete_unloads_it_from_vllm_and_the_name_serves_new_weights(
    tenants: Callable[[str], Tenant], vllm_server: VllmProcess, vllm_checkpoint: Path, tmp_path: Path
) -> None:
    acme = tenants("deleter")
    old_id = acme.create_and_upload("mine", random_adapter(tmp_path / "old", vllm_checkpoint, seed=5))
    base, old = acme.answer(), acme.answer("mine")
    assert old != base and old_id in served(vllm_server)

    deleted = acme.client.delete(f"/ai/finetunes/{old_id}")
    assert deleted.status_code == 200, deleted.text
    assert old_id not in served(vllm_server)  # the gateway unloaded it before answering
    for name_or_id in ("mine", old_id):
        gone = acme.ask(name_or_id)
        assert gone.status_code == 404 and "no finetune" in gone.json()["errors"][0]["message"], gone.text

    new_id = acme.create_and_upload("mine", random_adapter(tmp_path / "new", vllm_checkpoint, seed=6))
    new = acme.answer("mine")
    assert new_id != old_id and new not in (old, base)  # its own weights, not the deleted finetune's
    assert new_id in served(vllm_server) and old_id not in served(vllm_server)


def served(server: VllmProcess) -> list[str]:
    """The model names vLLM serves now: its base model and the adapters it has loaded."""
    models = httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {VLLM_API_KEY}"}, timeout=30)
    return [m["id"] for m in models.json()["data"]]
