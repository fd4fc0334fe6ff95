"""benchmarks/routing/vllm_backends.py: the gateway config it writes for the vLLM servers is one the gateway
accepts (a vLLM-served model, two `kind = "vllm"` backends with their KV events), and the goal
line reads the right rows. The run itself needs vLLM (tests/vllm run it for real)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from benchmarks.routing.vllm_backends import goal, vllm_gateway_toml
from gateway.settings import GatewaySettings
from loadtests.bench.metrics import LevelSummary, Percentiles
from loadtests.workers_ai import MODEL_ID
from tests.vllm.process import VllmProcess


def server(port: int) -> VllmProcess:
    """A VllmProcess record (its process long over): the config reads only its fields."""
    process = subprocess.Popen(["true"])
    process.wait()
    return VllmProcess("v", port, process, None, api_key="k" * 24,
                       kv_events_endpoint=f"ipc:///tmp/x-{port}", replay_endpoint=f"tcp://127.0.0.1:{port + 1}")  # fmt: skip


@pytest.mark.process  # VllmProcess wraps a real (if trivial) child process
def test_the_gateway_config_has_the_vllm_model_and_both_backends_with_their_events(tmp_path: Path) -> None:
    servers = {"vllm-a": server(9001), "vllm-b": server(9003)}
    text = vllm_gateway_toml(tmp_path, servers, tmp_path / "ckpt", "t" * 32)
    settings = GatewaySettings(**tomllib.loads(text))
    (model,) = settings.fleet.models
    assert (model.id, model.backend_model, model.tokenizer_dir) == (MODEL_ID, "smollm2", tmp_path / "ckpt")
    backends = {b.id: b for b in settings.fleet.backends}
    assert sorted(backends) == ["vllm-a", "vllm-b"]
    assert backends["vllm-b"].kind == "vllm" and backends["vllm-b"].kv_events == "ipc:///tmp/x-9003"
    assert backends["vllm-b"].kv_events_replay == "tcp://127.0.0.1:9004"
    assert settings.fleet.backend_api_key is not None


def summary(policy: str, cached: int) -> LevelSummary:
    none = Percentiles(None, None, None)
    values: dict[str, Any] = dict(
        policy=policy, workload="agent", load="concurrency 2", load_value=2, num_requests=10, num_ok=10,
        errors_by_code={}, duration_s=1, request_throughput=1, output_token_throughput=1, total_token_throughput=1,
        ttft_s=none, tpot_s=none, itl_s=none, e2e_s=none, goodput=1, slo_attainment=1,
        prompt_tokens=1000, cached_tokens=cached, completion_tokens=10,
    )  # fmt: skip
    return LevelSummary(**values)


def test_the_goal_compares_cache_aware_on_vllm_with_ours() -> None:
    met = goal([summary("vllm-cache_aware", 800), summary("vllm-round_robin", 100), summary("edgerun-cache_aware", 840)])
    assert met == ["concurrency 2: cached-token ratio, cache_aware: vLLM 80.0% vs our backends 84.0% "
                   "(+4.0 points; goal within 5) -> MET"]  # fmt: skip
    missed = goal([summary("vllm-cache_aware", 700), summary("edgerun-cache_aware", 840)])
    assert missed[0].endswith("(+14.0 points; goal within 5) -> NOT MET")
