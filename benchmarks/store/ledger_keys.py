"""What the request id's shape costs a ledger insert: random (UUID v4) against time-ordered (v7) keys.

    python -m benchmarks.store.ledger_keys [--records 1000000] [--inserts 5000] [--rounds 2]

The local store's ledger (gateway/store/local/database.py) is keyed by request id. For each kind of
id, a fresh SQLite file gets `--records` records in one transaction (ids of that kind, 1 ms apart),
then `--inserts` more are committed one per transaction through `Database.insert_usages`, as a
lone request's record is, and the CPU time of those commits is taken; the kinds alternate for
`--rounds` rounds. A random key lands on a page of the key's index of its own, which a large ledger
no longer holds in SQLite's cache; a time-ordered one is appended to the last page.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from benchmarks.common import machine
from gateway.http.middleware import uuid7_hex
from gateway.store.local.database import Database
from gateway.store.models import UsageRecord

T0 = 1_780_000_000.0
RECORD = UsageRecord(
    request_id="x", tenant_id="acme", account_id="acct1", key_id="key_1", model="@cf/meta/llama-3.1-8b-instruct",
    region="eu", backend_id="eu-1", session_id=None, started_at=T0, ended_at=T0, status="ok", prompt_tokens=120,
    cached_tokens=64, completion_tokens=33, price_version="2026-05-01", cost_micro=41, metadata={"team": "search"},
)


def v4(_: float) -> str:
    return uuid.uuid4().hex


def v7(at: float) -> str:
    """The gateway's request id (`new_request_id`) as made at time `at` (the ledger is filled as if
    over past hours)."""
    return uuid7_hex(int(at * 1000))


KINDS: dict[str, Callable[[float], str]] = {"random (v4)": v4, "time-ordered (v7)": v7}


def record_at(kind: Callable[[float], str], at: float) -> UsageRecord:
    return replace(RECORD, request_id=kind(at), started_at=at - 1.25, ended_at=at)


def cpu_us_per_insert(kind: Callable[[float], str], records: int, inserts: int) -> float:
    with tempfile.TemporaryDirectory(prefix="edgerun-ledger-keys-") as workdir:
        db = Database(str(Path(workdir) / "ledger.sqlite3"))
        try:
            at = T0 - (records + 1) / 1000
            db.insert_usages([record_at(kind, at + i / 1000) for i in range(records)], [0] * records)
            db.checkpoint()
            fresh = [record_at(kind, T0 + i / 1000) for i in range(inserts)]
            started = time.process_time()
            for record in fresh:
                db.insert_usages([record], [0])
            return (time.process_time() - started) * 1e6 / inserts
        finally:
            db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store.ledger_keys", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the ledger before timing")
    parser.add_argument("--inserts", type=int, default=5000, help="one-record commits timed")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {name: [] for name in KINDS}
    for _ in range(args.rounds):
        for name, kind in KINDS.items():
            results[name].append(cpu_us_per_insert(kind, args.records, args.inserts))
    command = "python -m benchmarks.store.ledger_keys " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}`  ")
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ")
    print(f"{args.records} records in the ledger, {args.inserts} one-record commits timed, {args.rounds} rounds")
    print()
    print("| request ids | CPU us per one-record commit (median) | rounds |")
    print("| --- | ---: | --- |")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
