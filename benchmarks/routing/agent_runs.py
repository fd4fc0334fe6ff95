"""The agent-workload options the real-process routing benchmarks share, and the BenchConfig they make.

kv_pool.py and vllm_backends.py both replay agent sessions at one load level through a gateway per
policy; each adds its own options beside these.
"""

from __future__ import annotations

import argparse

from loadtests.bench.runner import Load
from loadtests.bench.suite import BenchConfig
from loadtests.conversations import parse_range


def add_agent_arguments(parser: argparse.ArgumentParser, *, policies: str, sessions: int, turns: str,
                        max_tokens: int) -> None:
    """The policies to compare and the agent workload's shape, with this benchmark's defaults."""
    add = parser.add_argument
    add("--policies", default=policies)
    add("--sessions", type=int, default=sessions, help=f"agent sessions per run (default {sessions})")
    add("--turns", default=turns, help=f"turns per agent session, MIN-MAX (default {turns})")
    add("--max-tokens", type=int, default=max_tokens)
    add("--load", default="concurrency:2", help="one load level (default concurrency:2)")
    add("--seed", type=int, default=0)
    add("--max-level-seconds", type=float, default=240.0, help="a run stops sending after this long")


def agent_config(args: argparse.Namespace) -> BenchConfig:
    """The suite's configuration for the options `add_agent_arguments` added."""
    return BenchConfig(
        policies=tuple(args.policies.split(",")), workloads=("agent",), agent_loads=(Load.parse(args.load),),
        agent_sessions=args.sessions, agent_turns=parse_range(args.turns), max_tokens=args.max_tokens,
        seed=args.seed, max_level_s=args.max_level_seconds,
    )  # fmt: skip
