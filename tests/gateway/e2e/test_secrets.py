"""No secret leaks: a gateway process configured with every secret it knows (admin token, metrics
token, backend key, cache-salt secret, a Redis password) runs through errors of every kind (wrong
and missing keys, a tenant key on admin routes and on another tenant's usage, a dead backend, the
store going away), and its whole log (debug level), its /metrics text and every response body are
then searched for each secret and for the wrong keys clients presented. The only body allowed to
hold a key is the answer that created it. (Constant-time comparisons: gateway/admin_guard.py and
gateway/store/apikeys.py use hmac.compare_digest; the key lookup is by SHA-256 hash.)"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess, free_port
from tests.gateway.fixtures_e2e import start_gateway_process
from tests.gateway.redis_server import EPHEMERAL, start_redis
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.slow

ADMIN = "admin-token-secret-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
METRICS = "metrics-token-secret-MMMMMMMMMMMMMMMMMMMMMMMMMMMMMM"
BACKEND_KEY = "backend-key-secret-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
SALT = "cache-salt-secret-SSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSSS"
REDIS_PASSWORD = "redis-password-secret-RRRRRRRRRRRRRRRRRRRRRRRR"
WRONG_KEY = "wrong-api-key-WWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWW"
WRONG_ADMIN = "wrong-admin-token-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_no_secret_in_logs_metrics_or_error_bodies(stub_backend: ChildProcess, tmp_path: Path) -> None:
    redis = start_redis(tmp_path, [*EPHEMERAL, "--requirepass", REDIS_PASSWORD], password=REDIS_PASSWORD)
    dead_port = free_port()  # nothing listens there: the dead backend
    model, dead_model = STUB_MODEL, "@cf/edgerun/dead"
    env = {
        "EDGERUN_MODELS": json.dumps([{"id": m, "backend_model": "stub", "block_size": 16} for m in (model, dead_model)]),
        "EDGERUN_BACKENDS": json.dumps([
            {"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [model]},
            {"id": "dead", "base_url": f"http://127.0.0.1:{dead_port}", "region": "local", "models": [dead_model]},
        ]),
        "EDGERUN_REDIS_URL": f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0",
        "EDGERUN_REDIS_TIMEOUT_S": "0.5",
        "EDGERUN_KEY_PREFIX": "secrets-test:",
        "EDGERUN_LEDGER_SPOOL_PATH": str(tmp_path / "spool.jsonl"),
        "EDGERUN_ADMIN_TOKEN": ADMIN,
        "EDGERUN_METRICS_TOKEN": METRICS,
        "EDGERUN_BACKEND_API_KEY": BACKEND_KEY,
        "EDGERUN_CACHE_SALT_SECRET": SALT,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "debug",
        "EDGERUN_LOG_JSON": "true",
    }
    gateway = start_gateway_process(env)
    bodies: list[str] = []
    statuses: dict[str, int] = {}
    try:
        gateway.wait_ready()
        http = httpx.Client(base_url=gateway.url, timeout=30)

        def call(name: str, method: str, path: str, **options: object) -> httpx.Response:
            response = http.request(method, path, **options)  # type: ignore[arg-type]
            statuses[name] = response.status_code
            bodies.append(response.text)
            return response

        keys = {}
        for tenant in ("a", "b"):
            call(f"tenant {tenant}", "POST", "/admin/v1/tenants", headers=bearer(ADMIN),
                 json={"name": tenant, "id": f"t-{tenant}", "account_ids": [f"acc-{tenant}"]})
            created = http.post(f"/admin/v1/tenants/t-{tenant}/keys", headers=bearer(ADMIN), json={})
            assert created.status_code == 201, created.text
            keys[tenant] = created.json()["result"]["secret"]  # the one body allowed to hold it
        run = f"/client/v4/accounts/acc-a/ai/run/{model}"
        prompt = {"prompt": "hello", "max_tokens": 8}
        call("ok", "POST", run, headers=bearer(keys["a"]), json=prompt)
        call("wrong key", "POST", run, headers=bearer(WRONG_KEY), json=prompt)
        call("no key", "POST", run, json=prompt)
        call("other account", "POST", f"/client/v4/accounts/acc-b/ai/run/{model}", headers=bearer(keys["a"]), json=prompt)
        call("dead backend", "POST", f"/client/v4/accounts/acc-a/ai/run/{dead_model}", headers=bearer(keys["a"]),
             json=prompt)
        call("tenant key on admin", "GET", "/admin/v1/tenants", headers=bearer(keys["a"]))
        call("tenant key on export", "GET", "/admin/v1/billing/export", headers=bearer(keys["a"]))
        call("wrong admin token", "GET", "/admin/v1/tenants", headers=bearer(WRONG_ADMIN))
        call("other tenant's usage", "GET", "/dashboard/api/usage?tenant=t-b", headers=bearer(keys["a"]))
        call("tenant key on metrics", "GET", "/metrics", headers=bearer(keys["a"]))
        call("kv events", "POST", "/kv_cache_events", headers=bearer(keys["a"]))  # backends only, behind their key
        call("admin token on metrics", "GET", "/metrics", headers=bearer(ADMIN))
        call("debug explain", "POST", run, headers={**bearer(keys["a"]), "x-edgerun-explain": WRONG_ADMIN}, json=prompt)
        redis.stop(timeout_s=10)  # the store goes away: errors from the Redis client, with its URL in reach
        call("store down", "POST", run, headers=bearer(keys["a"]), json=prompt)
        call("store down, admin", "GET", "/admin/v1/tenants", headers=bearer(ADMIN))
        metrics_text = call("metrics", "GET", "/metrics", headers=bearer(METRICS)).text
        gateway.process.send_signal(signal.SIGTERM)
        gateway.process.wait(timeout=60)
        log = gateway.log()  # `stop` deletes it
    finally:
        gateway.stop()
        redis.stop()
    assert statuses["ok"] == 200 and statuses["metrics"] == 200
    assert statuses["wrong key"] == statuses["no key"] == 401
    assert statuses["other account"] == 403 and statuses["other tenant's usage"] == 403
    assert statuses["tenant key on admin"] == statuses["tenant key on export"] == statuses["wrong admin token"] == 401
    assert statuses["tenant key on metrics"] == 401 and statuses["admin token on metrics"] == 401
    assert statuses["dead backend"] == 429 and statuses["store down"] == 503
    assert statuses["kv events"] == 404  # the gateway exposes no KV events: tests/backends/test_security.py
    assert '"status": 503' in log and "unreachable" in log  # the log did capture the run and its errors
    secrets = {"admin token": ADMIN, "metrics token": METRICS, "backend key": BACKEND_KEY, "salt secret": SALT,
               "redis password": REDIS_PASSWORD, "wrong key": WRONG_KEY, "wrong admin token": WRONG_ADMIN,
               "key a": keys["a"], "key b": keys["b"]}
    for name, secret in secrets.items():
        assert secret not in log, f"the {name} is in the log"
        assert secret not in metrics_text, f"the {name} is in /metrics"
        for body in bodies:
            assert secret not in body, f"the {name} is in a response body: {body[:300]}"
