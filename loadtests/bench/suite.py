"""A benchmark run: every routing policy x workload x load level, on real processes.

For each policy the harness starts its own backends and a gateway with
`EDGERUN_ROUTING_POLICY=<policy>` (loadtests/stack.py), so every policy starts from cold KV
caches and an empty prefix index, and warms each backend up with one tiny request sent to it
directly (outside any tenant). All the policies' processes are up at once, and every load level
runs each policy in turn, the order rotating from level to level: on a machine whose background
load drifts (a shared CI box), the drift then falls on all policies alike instead of on whichever
ran last. Only the policy under test sends requests at any time; the others' processes sit idle.
Each level provisions new tenants: KV caches are salted with the tenant, so a level never reuses
what an earlier level cached. All policies replay the same sessions (same seed).

With `gateway_url` set, nothing is started: the levels run against that gateway (whose policy is
whatever it was configured with) and are labelled `label`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.bench.client import RequestRecord, send
from loadtests.bench.metrics import SLO, LevelSummary, summarize
from loadtests.bench.mooncake import (
    DEFAULT_TRACE,
    ScaledRequest,
    TraceScale,
    read_trace,
    reusable_block_ratio,
    scaled_trace,
    select,
)
from loadtests.bench.runner import Load, run_load
from loadtests.bench.workload import SessionPlan, agent_sessions, trace_sessions
from loadtests.stack import Stack, StackConfig, running_stack
from loadtests.tenants import DEFAULT_TENANTS, parse_tenants, provision
from loadtests.workers_ai import MODEL_ID

ALL_POLICIES = ("cache_aware", "prefix_threshold", "round_robin", "least_tokens", "session_hash")  # prefix_threshold: the reference
WORKLOADS = ("agent", "mooncake")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    policies: tuple[str, ...] = ALL_POLICIES
    num_backends: int = 2
    workloads: tuple[str, ...] = WORKLOADS
    agent_loads: tuple[Load, ...] = (Load("concurrency", 2), Load("concurrency", 4))
    trace_loads: tuple[Load, ...] = (Load("trace", 1.0),)
    agent_sessions: int = 8
    agent_turns: tuple[int, int] = (5, 8)
    max_tokens: int = 16
    trace_path: Path = DEFAULT_TRACE
    trace_scale: TraceScale = field(default_factory=TraceScale)
    tenants: str = DEFAULT_TENANTS
    seed: int = 0
    slo: SLO = field(default_factory=SLO)
    max_level_s: float = 300.0
    max_active_sessions: int = 8
    backend_args: tuple[str, ...] = ()
    model: str = MODEL_ID
    workdir: Path | None = None  # process logs go to workdir/<policy>/
    gateway_url: str | None = None
    admin_token: str | None = None
    label: str = "external"

    def __post_init__(self) -> None:
        unknown = set(self.workloads) - set(WORKLOADS)
        if unknown or not self.workloads:
            raise ValueError(f"workloads must be among {WORKLOADS}, got {self.workloads}")
        if self.gateway_url and not self.admin_token:
            raise ValueError("an external gateway needs its admin token (to create the tenants)")
        if self.agent_sessions < 1 or self.max_tokens < 1:
            raise ValueError("agent_sessions and max_tokens must be >= 1")
        parse_tenants(self.tenants)


@dataclass(slots=True)
class BenchResult:
    summaries: list[LevelSummary] = field(default_factory=list)
    records: list[tuple[str, str, RequestRecord]] = field(default_factory=list)  # (policy, load label, record)
    notes: list[str] = field(default_factory=list)


def warm_up(stack: Stack) -> None:
    """One tiny completion per backend, sent to it directly: first-request costs stay out of the numbers."""
    for backend in stack.backends:
        httpx.post(f"{backend.url}/v1/completions", json={"model": "smollm2", "prompt": "warm up", "max_tokens": 2},
                   timeout=120.0).raise_for_status()


async def run_level(url: str, admin_token: str, policy: str, workload: str, load: Load, config: BenchConfig,
                    trace: Sequence[ScaledRequest], level_index: int) -> tuple[LevelSummary, list[RequestRecord]]:
    keys = await asyncio.to_thread(provision, url, admin_token, parse_tenants(config.tenants),
                                   run_id=f"{policy[:6]}{level_index}-{uuid.uuid4().hex[:6]}")
    plans: list[SessionPlan]
    if workload == "agent":
        plans = agent_sessions(keys, config.agent_sessions, seed=config.seed, turns=config.agent_turns,
                               max_tokens=config.max_tokens)
    else:
        plans = trace_sessions(keys, trace)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    timeout = httpx.Timeout(connect=10.0, read=300.0, write=30.0, pool=None)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        level_start = time.perf_counter()

        async def send_turn(plan: SessionPlan, body: dict[str, Any]) -> tuple[RequestRecord, str]:
            return await send(http, plan, body, level_start=level_start, model=config.model)

        records = await run_load(plans, load, send_turn, max_duration_s=config.max_level_s,
                                 max_active_sessions=config.max_active_sessions, seed=config.seed)
    summary = summarize(records, policy=policy, workload=workload, load=load.label, load_value=load.value,
                        slo=config.slo)
    return summary, records


async def run_levels(gateways: dict[str, tuple[str, str]], config: BenchConfig, trace: Sequence[ScaledRequest],
                     result: BenchResult, progress: Callable[[str], None]) -> None:
    """Every workload's load levels; each level runs every policy (name -> (url, admin token)) in
    turn, starting with a different policy at each level."""
    policies = list(gateways)
    levels = [(workload, load) for workload in config.workloads
              for load in (config.agent_loads if workload == "agent" else config.trace_loads)]
    done: list[tuple[int, int, LevelSummary]] = []
    for index, (workload, load) in enumerate(levels):
        shift = index % len(policies)
        for policy in policies[shift:] + policies[:shift]:
            url, admin_token = gateways[policy]
            progress(f"  {policy}: {workload} at {load.label} ...")
            summary, records = await run_level(url, admin_token, policy, workload, load, config, trace, index)
            done.append((policies.index(policy), index, summary))
            result.records.extend((policy, load.label, r) for r in records)
            progress(f"  {policy}: {workload} at {load.label}: {summary.num_ok}/{summary.num_requests} ok, "
                     f"cached {summary.cached_token_ratio:.1%}, p90 TTFT "
                     f"{'-' if summary.ttft_s.p90 is None else f'{summary.ttft_s.p90:.2f} s'}")
    result.summaries.extend(summary for _, _, summary in sorted(done, key=lambda d: (d[0], d[1])))


def trace_notes(config: BenchConfig, trace: Sequence[ScaledRequest]) -> list[str]:
    s = config.trace_scale
    records = select(read_trace(config.trace_path), s)
    return [
        f"mooncake replay: {len(trace)} requests from the first {s.num_groups} groups (first hash id) with >= "
        f"{s.min_group_requests} requests; each 512-token block -> {s.block_tokens} tokens, at most {s.max_blocks} "
        f"blocks; max_tokens = output_length x {s.output_scale:g} in [2, {s.max_output_tokens}]; "
        f"time x {s.time_scale:g}; "
        f"block-reuse ceiling of this subset (one unlimited cache): {reusable_block_ratio(records, s.max_blocks):.1%}",
    ]


def run_benchmark(config: BenchConfig, progress: Callable[[str], None] = print) -> BenchResult:
    result = BenchResult()
    trace: list[ScaledRequest] = []
    if "mooncake" in config.workloads:
        trace = scaled_trace(read_trace(config.trace_path), config.trace_scale)
        result.notes += trace_notes(config, trace)
    if config.gateway_url:
        assert config.admin_token is not None
        progress(f"{config.label}: against {config.gateway_url}")
        gateways = {config.label: (config.gateway_url, config.admin_token)}
        asyncio.run(run_levels(gateways, config, trace, result, progress))
    else:
        result.notes.append(
            f"each policy has its own {config.num_backends} fresh backends and gateway (cold KV caches and prefix "
            "index); every level runs each policy in turn, the order rotating per level; fresh tenants per level; "
            f"the same sessions (seed {config.seed}) for every policy"
        )
        with contextlib.ExitStack() as running:
            gateways = {}
            for policy in config.policies:
                workdir = None if config.workdir is None else config.workdir / policy
                progress(f"{policy}: starting {config.num_backends} backend(s) and a gateway ...")
                stack_config = StackConfig(num_backends=config.num_backends, policy=policy, workdir=workdir,
                                           backend_args=config.backend_args)
                stack = running.enter_context(running_stack(stack_config))
                warm_up(stack)
                gateways[policy] = (stack.url, stack.admin_token)
            asyncio.run(run_levels(gateways, config, trace, result, progress))
    mismatched = [r for _, _, r in result.records if r.ok and r.expected_prompt_tokens is not None
                  and r.prompt_tokens != r.expected_prompt_tokens]
    if mismatched:
        result.notes.append(f"{len(mismatched)} trace requests tokenized to a different length than built "
                            f"(e.g. {mismatched[0].prompt_tokens} vs {mismatched[0].expected_prompt_tokens}): "
                            "block boundaries may not align with cache blocks")
    return result
