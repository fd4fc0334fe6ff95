"""Cold start of `edgerun backend`: from exec to the first healthy GET /health, and where it goes.

    python -m benchmarks.backend.cold_start [--rounds 5] [--threads 2] [--backend-arg=--mode --backend-arg=deterministic]

Each round spawns a fresh `python -m cli backend` (model cached already: the first start after
install converts the GGUF once, which is not what this measures), polls /health every 10 ms until it
answers 200, and records the wall time and the child's CPU time (user + system, read from /proc just
before it is stopped: steadier than wall time on a shared machine). Then one child runs with
`-X importtime` and the top-level imports that cost the most are listed, and the start-up phases of
an in-process start (imports, settings, model load and weight packing, first token) are timed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

import httpx

from benchmarks.common import machine, process_cpu_s
from cli.processes import ROOT, ChildProcess, child_env, free_port

PHASES = """
import time
t0, c0 = time.perf_counter(), time.process_time()
marks = []
def mark(name): marks.append((name, time.perf_counter() - t0, time.process_time() - c0))
import cli.backend, backends.server.serve
mark("cli + server imports (before torch)")
import torch
mark("import torch")
from engines.builtin.engine.async_engine import AsyncEngine
from backends.settings import BackendSettings
settings = BackendSettings()
mark("engine imports + settings")
engine = AsyncEngine(settings.engine)
mark("model load + weight packing")
from engines.base import GenerationRequest
from engines.sampling_params import SamplingParams
llm = engine.engine
llm.add_request(GenerationRequest("cold", llm.tokenizer.encode("Hello!"), SamplingParams(max_tokens=1)))
while llm.has_unfinished:
    llm.step()
mark("first token")
last = (0.0, 0.0)
for name, wall, cpu in marks:
    print(f"{name}\\t{wall - last[0]:.3f}\\t{cpu - last[1]:.3f}")
    last = (wall, cpu)
"""


def one_start(args: argparse.Namespace) -> tuple[float, float]:
    """(wall s from exec to a healthy /health, the child's CPU s by then)."""
    port = free_port()
    started = time.perf_counter()
    child = ChildProcess.spawn("cold-start", "backend", ["--log-level", "warning", *args.backend_arg], port=port,
                               keep_edgerun_env=True, threads=args.threads)
    try:
        while True:
            try:
                if httpx.get(f"{child.url}/health", timeout=1.0).status_code == 200:
                    return time.perf_counter() - started, process_cpu_s(child.process.pid)
            except httpx.HTTPError:
                pass
            if child.process.poll() is not None:
                raise RuntimeError(f"the backend exited:\n{child.log_tail()}")
            time.sleep(0.01)
    finally:
        child.stop(timeout_s=30)


def import_costs(args: argparse.Namespace, top: int = 8) -> list[tuple[str, float]]:
    """The costliest top-level packages under `-X importtime` of the backend's modules: seconds each,
    cumulative (a package's own line, which includes what it imports first, e.g. torch's numpy)."""
    code = "import cli.backend, backends.server.serve, engines.builtin.engine.async_engine"
    env = child_env({}, keep_edgerun=True, threads=args.threads)
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stderr
    costs: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            _, cumulative, name = line.removeprefix("import time:").split("|")
            if "." not in name.strip():
                costs[name.strip()] = max(costs.get(name.strip(), 0.0), int(cumulative) / 1e6)
    return sorted(costs.items(), key=lambda c: -c[1])[:top]


def phases(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    env = child_env({}, keep_edgerun=True, threads=args.threads)
    out = subprocess.run([sys.executable, "-c", PHASES], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    rows = [line.split("\t") for line in out.stdout.splitlines() if line.count("\t") == 2]
    return [(name, float(wall), float(cpu)) for name, wall, cpu in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend.cold_start", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="the backend's CPU threads (OMP_NUM_THREADS)")
    parser.add_argument("--backend-arg", action="append", default=[], metavar="ARG",
                        help="an extra `edgerun backend` argument (repeatable)")
    args = parser.parse_args(argv)
    one_start(args)  # the first start may convert the GGUF or build derived weights: not a cold start
    load_start = os.getloadavg()[0]
    starts = [one_start(args) for _ in range(args.rounds)]
    print(f"Command: `python -m benchmarks.backend.cold_start {shlex.join(sys.argv[1:] if argv is None else argv)}`")
    print(f"Machine: {machine()}, {args.threads} threads, load average {load_start:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end\n")
    walls = [w for w, _ in starts]
    print(f"exec -> healthy /health: median {statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}); "
          f"child CPU median {statistics.median(c for _, c in starts):.2f} s\n")
    print("| phase (in-process start) | wall s | CPU s |\n| --- | ---: | ---: |")
    for name, wall, cpu in phases(args):
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    print("\n| import (cumulative) | s |\n| --- | ---: |")
    for name, seconds in import_costs(args):
        print(f"| {name} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
