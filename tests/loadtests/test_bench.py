"""Tiny end-to-end benchmark runs: the launcher path (a fresh backend and gateway per policy) and
the external-gateway path (the shared stack), with every report written."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from loadtests.bench.cli import main
from loadtests.bench.runner import Load
from loadtests.bench.suite import BenchConfig, BenchResult, run_levels
from loadtests.stack import Stack
from tests.loadtests.conftest import STACK_POLICY

pytestmark = pytest.mark.slow


def test_a_policy_run_on_fresh_processes_writes_every_report(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main([
        "--policies", "cache_aware", "--backends", "1", "--agent-load", "concurrency:2",
        "--sessions", "2", "--turns", "3", "--max-tokens", "4", "--trace-load", "trace:1", "--trace-groups", "1",
        "--max-blocks", "4", "--time-scale", "0.005", "--max-output-tokens", "4", "--max-level-seconds", "60",
        "--out", str(out),
    ])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    summaries = {s["workload"]: s for s in data["summaries"]}
    assert set(summaries) == {"agent", "mooncake"}
    for s in summaries.values():
        assert s["policy"] == "cache_aware"
        assert s["num_ok"] == s["num_requests"] > 0 and s["errors_by_code"] == {}
        assert s["ttft_s"]["p50"] > 0 and s["e2e_s"]["p90"] >= s["ttft_s"]["p90"] > 0
        assert s["request_throughput"] > 0 and s["output_token_throughput"] > 0
    assert summaries["agent"]["num_requests"] == 6  # 2 sessions x 3 turns
    assert summaries["agent"]["cached_token_ratio"] > 0.3  # later turns resend the conversation
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    replayed = [r for r in requests if r["workload"] == "mooncake"]
    assert replayed and all(r["prompt_tokens"] == r["expected_prompt_tokens"] for r in replayed)  # a token per word
    assert "| cache_aware | agent |" in (out / "results.md").read_text()
    for png in ("latency_vs_load.png", "policies.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert (out / "processes" / "cache_aware" / "gateway.log").exists()


def test_against_a_running_gateway(stack: Stack, tmp_path: Path) -> None:
    code = main([
        "--gateway-url", stack.url, f"--admin-token={stack.admin_token}", "--label", "shared", "--workloads", "agent",
        "--agent-load", "rate:4", "--sessions", "2", "--turns", "2", "--max-tokens", "4", "--out", str(tmp_path),
    ])
    assert code == 0
    summary = json.loads((tmp_path / "results.json").read_text())["summaries"][0]
    assert (summary["policy"], summary["load"], summary["num_ok"]) == ("shared", "rate 4/s", 4)
    # the launcher gave the gateway its policy through EDGERUN_ROUTING_POLICY
    metrics = httpx.get(f"{stack.url}/metrics").text
    assert f'edgerun_gateway_routing_decisions_total{{backend="b1",policy="{STACK_POLICY}"}}' in metrics


async def test_every_level_runs_each_policy_in_a_rotating_order(stack: Stack) -> None:
    config = BenchConfig(workloads=("agent",), agent_loads=(Load("concurrency", 1), Load("concurrency", 2)),
                         agent_sessions=1, agent_turns=(1, 1), max_tokens=2, gateway_url=stack.url,
                         admin_token=stack.admin_token)
    gateway = (stack.url, stack.admin_token)
    lines: list[str] = []
    result = BenchResult()
    await run_levels({"first": gateway, "second": gateway}, config, [], result, lines.append)
    started = [line.split(":")[0].strip() for line in lines if line.endswith("...")]
    assert started == ["first", "second", "second", "first"]
    assert [(s.policy, s.load_value) for s in result.summaries] == [("first", 1), ("first", 2), ("second", 1),
                                                                     ("second", 2)]
    assert all(s.num_ok == 1 for s in result.summaries)
