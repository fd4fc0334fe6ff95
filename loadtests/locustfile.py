"""Locust scenarios against an edgerun gateway (users in locust_users.py, metrics in locust_metrics.py).

Against a gateway whose admin token you hold (tenants and keys are created at test start):

    locust -f loadtests/locustfile.py --headless -u 4 -r 2 -t 30s --host http://127.0.0.1:8080 \
        --edgerun-admin-token "$ADMIN_TOKEN" --csv reports/locust/run --html reports/locust/run.html

or with keys made beforehand (`--edgerun-keys-file keys.json`, a list of {name, tenant_id,
account_id, secret, weight}). `python -m loadtests.run_locust` (what `make loadtest` runs)
starts backends and a gateway itself, runs this headless and stops everything.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gevent
from locust import events
from locust import stats as locust_stats
from locust.env import Environment

from loadtests.conversations import parse_range
from loadtests.locust_metrics import RunTotals
from loadtests.locust_users import AgentUser, BatchUser, ChatUser
from loadtests.tenants import DEFAULT_TENANTS, ProvisionError, load_keys, parse_tenants, provision
from loadtests.workers_ai import MODEL_ID

__all__ = ["AgentUser", "BatchUser", "ChatUser"]
log = logging.getLogger("edgerun.loadtest")


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    group = parser.add_argument_group("edgerun")
    group.add_argument("--edgerun-admin-token", env_var="EDGERUN_LOADTEST_ADMIN_TOKEN", default="",
                       help="gateway admin token: tenants and keys are created at test start")
    group.add_argument("--edgerun-keys-file", env_var="EDGERUN_LOADTEST_KEYS_FILE", default="",
                       help="JSON list of provisioned tenants instead (name, tenant_id, account_id, secret, weight)")
    group.add_argument("--edgerun-tenants", default=DEFAULT_TENANTS, help="tenants to create, name:weight,...")
    group.add_argument("--edgerun-model", default=MODEL_ID, help="Workers AI model id")
    group.add_argument("--edgerun-max-tokens", type=int, default=24, help="max_tokens of every request")
    group.add_argument("--edgerun-agent-turns", default="5-20", help="turns per agent session, MIN-MAX")
    group.add_argument("--edgerun-summary", default="", help="write token totals and the cached-token ratio (JSON)")


@events.test_start.add_listener
def provision_tenants(environment: Environment, **_: Any) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per admin call
    options = environment.parsed_options
    totals = RunTotals()
    environment.edgerun = totals  # type: ignore[attr-defined]  # read by the users' on_start
    try:
        parse_range(options.edgerun_agent_turns)
        if options.edgerun_keys_file:
            totals.tenants = load_keys(Path(options.edgerun_keys_file))
        elif options.edgerun_admin_token:
            assert environment.host, "give --host"
            specs = parse_tenants(options.edgerun_tenants)
            totals.tenants = provision(environment.host, options.edgerun_admin_token, specs)
        else:
            raise ProvisionError("give --edgerun-admin-token (or EDGERUN_LOADTEST_ADMIN_TOKEN) or --edgerun-keys-file")
    except (ProvisionError, ValueError, AssertionError) as exc:
        log.error("cannot set up tenants: %s", exc)
        environment.process_exit_code = 2
        if environment.runner is not None:
            gevent.spawn_later(0, environment.runner.quit)
        return
    log.info("tenants: %s", ", ".join(f"{k.name} (weight {k.weight:g})" for k in totals.tenants))


@events.quitting.add_listener
def write_summary(environment: Environment, **_: Any) -> None:
    if environment.parsed_options.csv_prefix:
        # Locust's CSV writer is a greenlet that rewrites the files every CSV_STATS_INTERVAL_SEC and
        # is not flushed at shutdown: give it one more pass, or answers that arrived in the last
        # interval (all of them, in a run of a few seconds) are missing from the CSV.
        gevent.sleep(locust_stats.CSV_STATS_INTERVAL_SEC + 0.2)
    totals: RunTotals | None = getattr(environment, "edgerun", None)
    if totals is None:
        return
    summary = totals.summary()
    log.info("cached-token ratio %.3f over %d requests; errors by code: %s", summary["cached_token_ratio"],
             summary["requests_with_usage"], summary["errors_by_code"] or "none")
    if environment.parsed_options.edgerun_summary:
        totals.write(Path(environment.parsed_options.edgerun_summary))
