"""Instructions a gateway process executes per streamed request, counted by valgrind's callgrind.

    python -m benchmarks.gateway.instructions [--baseline-tree PATH] [--requests 200] [--clients 4] [--rounds 2]

CPU time per request on a shared 2-core machine moves by 10-20% between runs with its neighbours'
load; an instruction count hardly does. Each side is
`edgerun serve` (local store, a temporary SQLite file) started under callgrind with instrumentation
off, in front of the stub backend; after a warm-up, instrumentation is switched on
(`callgrind_control -i on`), `--clients` threads send `--requests` streamed Workers AI requests in
all (8 chunks each), and the count is dumped; then the gateway idles as long again (at most 20 s)
and that count, its background tasks' (health checks, polls) per second, is taken out of the
requests' window before dividing by the requests. Sides alternate within each round (this tree, then
`--baseline-tree`, e.g. `git worktree add /tmp/base <commit>`); the table gives each round's
millions of instructions per request and the ratio of the medians. Needs valgrind (Debian's
package); the gateway runs some 50x slower under it, so a side takes a minute or two.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.common import machine
from cli.processes import ROOT, free_port
from tests.gateway.stub_backend import ADMIN_TOKEN, MODEL_ID, PROMPT, create_key, gateway_env, start_stub

READY_TIMEOUT_S = 300.0  # the gateway's start under valgrind
IDLE_S = 20.0  # the longest idle window measured after the requests


def count(tree: Path, stub_port: int, requests: int, clients: int, workdir: Path) -> float:
    """Millions of instructions the gateway of `tree` executes per streamed request."""
    out = workdir / "callgrind.out"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")},
        "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        **gateway_env(stub_port),
        "PYTHONPATH": str(tree),
    }
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
               sys.executable, "-m", "cli", "serve", "--port", str(port)]
    with (workdir / "valgrind.log").open("w") as log:
        gateway = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(base):
            if gateway.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway under valgrind did not start: see {workdir / 'valgrind.log'}")
            time.sleep(1)
        key = create_key(base, "bench")
        url = f"{base}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
        _send(url, key, clients, 5)  # warm-up: connections, tokenizer, routes
        subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)], check=True, capture_output=True)
        per_client = max(1, requests // clients)
        started = time.monotonic()
        _send(url, key, clients, per_client)
        busy_s = time.monotonic() - started
        subprocess.run(["callgrind_control", "-d", str(gateway.pid)], check=True, capture_output=True)
        idle_s = min(busy_s, IDLE_S)
        time.sleep(idle_s)  # the background tasks alone (health checks, polls), to take out of the count
        subprocess.run(["callgrind_control", "-d", str(gateway.pid)], check=True, capture_output=True)
    finally:
        gateway.terminate()
        gateway.wait(120)
    background_per_s = _summary(workdir / "callgrind.out.2") / idle_s
    requests_only = _summary(workdir / "callgrind.out.1") - background_per_s * busy_s
    return requests_only / (per_client * clients) / 1e6


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _send(url: str, key: str, clients: int, each: int) -> None:
    """`clients` threads, each sending `each` streamed requests one after another; every answer must end in [DONE]."""
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            for _ in range(each):
                answer = http.post(url, json={"prompt": PROMPT, "max_tokens": 8, "stream": True},
                                   headers={"authorization": f"Bearer {key}"})
                if answer.status_code != 200 or "[DONE]" not in answer.text:
                    failures.append(f"{answer.status_code}: {answer.text[:200]}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, e.g. {failures[0]}")


def _summary(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {dump}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.instructions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, measured in the same rounds")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per side and round")
    parser.add_argument("--clients", type=int, default=4, help="client threads sending them")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    sides = [("this tree", ROOT)] + ([("baseline", args.baseline_tree.resolve())] if args.baseline_tree else [])
    counts: dict[str, list[float]] = {name: [] for name, _ in sides}
    stub = start_stub(8)
    try:
        for _ in range(args.rounds):
            for name, tree in sides:
                with tempfile.TemporaryDirectory() as tmp:
                    counts[name].append(count(tree, stub.port, args.requests, args.clients, Path(tmp)))
    finally:
        stub.stop(timeout_s=10)
    command = "python -m benchmarks.gateway.instructions " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}`  \nmachine: {machine()}\n")
    print("| side | M instructions per streamed request, each round | median |")
    print("| --- | --- | ---: |")
    for name, values in counts.items():
        print(f"| {name} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.median(values):.3f} |")
    if args.baseline_tree:
        ratio = statistics.median(counts["this tree"]) / statistics.median(counts["baseline"])
        print(f"\nthis tree / baseline: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
