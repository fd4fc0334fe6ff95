"""Tenants' LoRA finetunes end to end: the real gateway in front of a real built-in backend (the tiny random
Llama, deterministic) that loads adapters from the gateway's finetunes directory. Upload, list, call, another
tenant's 404, delete (unloaded from the backend, a new finetune of the same name served its own weights, a backend
that is down does not fail it), the prefix cache never shared across adapters, and two tenants' adapters in one
batch."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.processes import free_port
from engines.builtin.loader.random import preset_config
from gateway.settings import GatewaySettings
from tests.engines.lora_files import ALL_MODULES, write_adapter
from tests.gateway.finetune_tenants import FinetuneTenant, finetune_tenants
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, running_tiny_backend

pytestmark = pytest.mark.slow
MODEL = "@cf/test/tiny-lora"
PLAIN = "@cf/test/tiny-plain"  # in the catalog, without adapters
TINY = preset_config("tiny")
TINY_SHAPE = {"num_layers": TINY.num_layers, "hidden_size": TINY.hidden_size, "num_heads": TINY.num_heads,
              "num_kv_heads": TINY.num_kv_heads, "head_dim": TINY.head_dim, "intermediate_size": TINY.intermediate_size}
PROMPT = "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun."  # > 4 blocks of bytes


@pytest.fixture(scope="module")
def finetunes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("finetunes")


@pytest.fixture(scope="module")
def backend(finetunes_dir: Path) -> Iterator[BackendProcess]:
    with running_tiny_backend("lora", "--mode", "deterministic", "--weight-dtype", "float32",
                              "--lora-dir", str(finetunes_dir)) as process:
        yield process


def settings_for(tmp: Path, backends: list[dict[str, Any]], finetunes_dir: Path) -> GatewaySettings:
    return gateway_settings(tmp, backends, models=[{"id": MODEL, "backend_model": "random:tiny", "lora": TINY_SHAPE},
                                                   {"id": PLAIN, "backend_model": "random:tiny"}],
                            finetunes_dir=finetunes_dir)


@pytest.fixture(scope="module")
def gateway(backend: BackendProcess, finetunes_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    started = InProcessGateway(settings_for(tmp_path_factory.mktemp("gw"), [backend.spec([MODEL])], finetunes_dir)).start()
    yield started
    started.stop()


@pytest.fixture
def tenants(gateway: InProcessGateway) -> Iterator[Callable[[str], Tenant]]:
    with finetune_tenants(gateway, MODEL, Tenant) as make:
        yield make


class Tenant(FinetuneTenant):
    def ask(self, lora: str | None = None, prompt: str = PROMPT) -> dict[str, Any]:
        """`run`'s status, body and request id."""
        answer = self.run(prompt, 8, lora)
        return {"status": answer.status_code, "json": answer.json(), "ray": answer.headers.get("cf-ray")}


def adapter(tmp: Path, name: str, seed: int, rank: int = 8, targets: tuple[str, ...] = ALL_MODULES) -> Path:
    return write_adapter(tmp / name, TINY, rank, targets, seed=seed, std=0.5)


def test_upload_list_call_isolate_and_delete(
    gateway: InProcessGateway, tenants: Callable[[str], Tenant], tmp_path: Path
) -> None:
    acme, beta = tenants("acme"), tenants("beta")
    created = acme.create("french")
    assert created.status_code == 200, created.text
    finetune = created.json()["result"]
    assert finetune["name"] == "french" and finetune["model"] == MODEL
    acme.upload_dir(finetune["id"], adapter(tmp_path, "french", seed=1))
    listed = acme.client.get("/ai/finetunes").json()["result"]
    assert [f["id"] for f in listed] == [finetune["id"]]
    assert beta.client.get("/ai/finetunes").json()["result"] == []

    base = acme.ask()
    by_name, by_id = acme.ask("french"), acme.ask(finetune["id"])
    assert base["status"] == by_name["status"] == 200, (base, by_name)
    assert by_name["json"]["result"]["response"] == by_id["json"]["result"]["response"]
    assert by_name["json"]["result"]["response"] != base["json"]["result"]["response"]
    record = gateway.ledger_record(by_name["ray"])
    assert record.model == MODEL and record.metadata["lora"] == finetune["id"]  # billed as its base model

    for name_or_id in ("french", finetune["id"]):  # another tenant's finetune does not exist for beta
        refused = beta.ask(name_or_id)
        assert refused["status"] == 404 and "no finetune" in refused["json"]["errors"][0]["message"]
    assert beta.client.delete(f"/ai/finetunes/{finetune['id']}").status_code == 404
    assert acme.client.delete(f"/ai/finetunes/{finetune['id']}").status_code == 200
    assert acme.ask("french")["status"] == 404
    assert acme.client.get("/ai/finetunes").json()["result"] == []


def test_delete_unloads_the_adapter_and_a_new_one_of_that_name_serves_its_own_weights(
    backend: BackendProcess, tenants: Callable[[str], Tenant], tmp_path: Path
) -> None:
    acme = tenants("renamer")
    old_id = acme.create_and_upload("tuned", adapter(tmp_path, "old", seed=21))
    base = acme.ask()["json"]["result"]["response"]
    old = acme.ask("tuned")["json"]["result"]["response"]
    assert old != base
    assert old_id in resident(backend)

    assert acme.client.delete(f"/ai/finetunes/{old_id}").status_code == 200
    assert old_id not in resident(backend)  # unloaded from the backend's slots before the delete answered
    for name_or_id in ("tuned", old_id):
        gone = acme.ask(name_or_id)
        assert gone["status"] == 404 and "no finetune" in gone["json"]["errors"][0]["message"], gone
    unloaded_again = httpx.post(f"{backend.url}/v1/unload_lora_adapter", json={"lora_name": old_id}, timeout=10)
    assert unloaded_again.status_code == 404 and "cannot be found" in unloaded_again.text  # vLLM's answer, as vLLM

    new_id = acme.create_and_upload("tuned", adapter(tmp_path, "new", seed=22))  # the same name, other weights
    assert new_id != old_id
    new = acme.ask("tuned")["json"]["result"]["response"]
    assert new not in (old, base)
    assert new == acme.ask(new_id)["json"]["result"]["response"]
    assert new_id in resident(backend) and old_id not in resident(backend)


def test_a_backend_that_is_down_does_not_fail_the_delete(
    backend: BackendProcess, finetunes_dir: Path, tmp_path: Path
) -> None:
    down = {"id": "down", "base_url": f"http://127.0.0.1:{free_port()}", "region": "local", "models": [MODEL]}
    gateway = InProcessGateway(settings_for(tmp_path / "gw", [backend.spec([MODEL]), down], finetunes_dir)).start()
    try:
        with finetune_tenants(gateway, MODEL, Tenant) as make:
            acme = make("downside")
            finetune_id = acme.create_and_upload("tuned", adapter(tmp_path, "a", seed=31))
            assert acme.ask("tuned")["status"] == 200  # on the live backend (the other one refuses connections)
            assert finetune_id in resident(backend)
            deleted = acme.client.delete(f"/ai/finetunes/{finetune_id}")
            assert deleted.status_code == 200, deleted.text
            assert finetune_id not in resident(backend)  # the live one was told all the same
            assert acme.ask("tuned")["status"] == 404
    finally:
        gateway.stop()


def resident(backend: BackendProcess) -> list[str]:
    """The adapters the built-in backend reports resident (/load), as the gateway's router reads them."""
    adapters: list[str] = httpx.get(f"{backend.url}/load", timeout=10).json()["adapters"]
    return adapters


def test_uploads_are_checked_with_clear_400s(tenants: Callable[[str], Tenant], tmp_path: Path) -> None:
    acme = tenants("checks")
    no_lora = acme.create("x", model=PLAIN)
    assert no_lora.status_code == 400 and "does not accept LoRA" in no_lora.text, no_lora.text
    finetune_id = acme.create("checked").json()["result"]["id"]
    assert acme.create("checked").status_code == 400  # the name is taken
    good = adapter(tmp_path, "good", seed=2)
    config = json.loads((good / "adapter_config.json").read_text())
    cases = [
        ("notes.txt", b"{}", "file_name must be"),
        ("adapter_config.json", json.dumps({**config, "r": 64}).encode(), "rank"),
        ("adapter_config.json", json.dumps({**config, "target_modules": ["lm_head"]}).encode(), "target_modules"),
        ("adapter_model.safetensors", b"not safetensors", "safetensors"),
    ]
    for file_name, data, words in cases:
        answer = acme.upload(finetune_id, file_name, data)
        assert answer.status_code == 400 and words in answer.text, (file_name, answer.text)
    wrong_shape = write_adapter(tmp_path / "wide", TINY, 4, ("q_proj",), seed=3)  # rank 4 weights
    assert acme.upload(finetune_id, "adapter_config.json", (good / "adapter_config.json").read_bytes()).status_code == 200
    answer = acme.upload(finetune_id, "adapter_model.safetensors", (wrong_shape / "adapter_model.safetensors").read_bytes())
    assert answer.status_code == 400 and "shape" in answer.text, answer.text
    incomplete = acme.ask("checked")
    assert incomplete["status"] == 400 and "adapter_model.safetensors" in incomplete["json"]["errors"][0]["message"]


def test_prefix_cache_is_per_adapter_and_two_tenants_adapters_share_a_batch(
    backend: BackendProcess, tenants: Callable[[str], Tenant], tmp_path: Path
) -> None:
    one, two = tenants("one"), tenants("two")
    ids = []
    for tenant, seed in ((one, 11), (two, 12)):
        finetune_id = tenant.create("mine").json()["result"]["id"]
        tenant.upload_dir(finetune_id, adapter(tmp_path, f"t{seed}", seed=seed, rank=4 * (seed - 10)))
        ids.append(finetune_id)
    second = f"{PROMPT} And again."  # one's own prefix, never served to its other adapter or base
    first = one.ask("mine", second)
    again = one.ask("mine", second)
    assert again["json"]["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64, again
    assert again["json"]["result"]["response"] == first["json"]["result"]["response"]
    base = one.ask(None, second)
    assert base["json"]["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, base
    finetune_b = one.create("other").json()["result"]["id"]
    one.upload_dir(finetune_b, adapter(tmp_path, "other", seed=13))
    other = one.ask("other", second)
    assert other["json"]["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, other

    solo = {name: t.ask("mine")["json"]["result"]["response"] for name, t in (("one", one), ("two", two))}
    solo_base = one.ask()["json"]["result"]["response"]
    calls = [(one, "mine"), (two, "mine"), (one, None), (two, "mine"), (one, "mine")] * 2
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda c: c[0].ask(c[1]), calls))
    for (tenant, lora), answer in zip(calls, answers):
        assert answer["status"] == 200, answer
        expected = solo_base if lora is None else solo["one" if tenant is one else "two"]
        assert answer["json"]["result"]["response"] == expected
    load = httpx.get(f"{backend.url}/load", timeout=10).json()
    assert set(ids) <= set(load["adapters"])
