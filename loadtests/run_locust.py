"""`python -m loadtests.run_locust` (what `make loadtest` runs): a bounded, headless Locust run.

Starts backends and a gateway on loopback (loadtests/stack.py), runs
`locust -f loadtests/locustfile.py --headless -u N -r R -t T` against the gateway with its admin
token (the locustfile creates the tenants), writes `<out>/locust_stats.csv` (and the other
Locust CSVs), `<out>/locust.html` and `<out>/summary.json`, stops everything and exits with
Locust's exit code (1 when any request failed).

Defaults are sized for a 2-core CPU machine and the 135M model: 4 users, 30 s, 24 tokens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cli.processes import ROOT
from loadtests.stack import StackConfig, running_stack
from loadtests.tenants import DEFAULT_TENANTS


def locust_command(host: str, admin_token: str, args: argparse.Namespace) -> list[str]:
    out: Path = args.out
    return [
        sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless",
        "-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.run_time,
        "--stop-timeout", str(args.stop_timeout),
        "--host", host, "--csv", str(out / "locust"), "--html", str(out / "locust.html"), "--only-summary",
        # one argument: a token that starts with "-" would be read as a flag (secrets.token_urlsafe can make one)
        f"--edgerun-admin-token={admin_token}", "--edgerun-tenants", args.tenants,
        "--edgerun-max-tokens", str(args.max_tokens), "--edgerun-agent-turns", args.agent_turns,
        "--edgerun-summary", str(out / "summary.json"), *args.locust_args,
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--users", "-u", type=int, default=4, help="simulated users (default 4)")
    add("--spawn-rate", "-r", type=float, default=2.0, help="users started per second (default 2)")
    add("--run-time", "-t", default="30s", help="how long the load runs, Locust syntax (default 30s)")
    add("--stop-timeout", default="30s", help="seconds users get to finish their turn at the end")
    add("--backends", type=int, default=1, help="backends behind the gateway (default 1)")
    add("--policy", default="cache_aware", help="the gateway's routing policy (default cache_aware)")
    add("--tenants", default=DEFAULT_TENANTS, help=f"tenants as name:weight,... (default {DEFAULT_TENANTS})")
    add("--max-tokens", type=int, default=24, help="max_tokens of every request (default 24)")
    add("--agent-turns", default="5-20", help="turns per agent session (default 5-20)")
    add("--out", type=Path, default=Path("reports/locust"), help="report folder (default reports/locust)")
    add("--backend-arg", dest="backend_args", action="append", default=[], help="extra `edgerun backend` flag (repeat)")
    add("locust_args", nargs="*", help="more Locust arguments after --")


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    config = StackConfig(num_backends=args.backends, policy=args.policy, workdir=args.out / "stack",
                         backend_args=tuple(args.backend_args))
    print(f"starting {args.backends} backend(s) and a gateway ({args.policy}) ...", flush=True)
    with running_stack(config) as stack:
        print(f"gateway {stack.url}; running Locust for {args.run_time} with {args.users} users", flush=True)
        code = subprocess.call(locust_command(stack.url, stack.admin_token, args), cwd=ROOT)
    print(f"reports in {args.out}/ (locust_stats.csv, locust.html, summary.json); Locust exit code {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.run_locust", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
