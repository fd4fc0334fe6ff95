"""GatewaySettings: one section per part, and every setting still reachable by its one flat name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings, section_of
from gateway.store.settings import StoreSettings


def test_flat_constructor_arguments_land_in_their_sections() -> None:
    s = GatewaySettings(redis_url="redis://h:6379/0", port=0, log_json=False, disagg_max_local_prefill_length=64)
    assert s.store.redis_url == "redis://h:6379/0" and s.http.port == 0
    assert s.logging.log_json is False and s.disagg.disagg_max_local_prefill_length == 64


def test_flat_environment_variables_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_REDIS_URL", "redis://env:6379/0")
    monkeypatch.setenv("EDGERUN_REGION_FALLBACKS", '["us-east", "ap-south"]')
    monkeypatch.setenv("EDGERUN_MAX_HEADERS", "50")
    monkeypatch.setenv("EDGERUN_FLEET__HEALTH_FALL", "7")  # the sectioned form too
    s = GatewaySettings()
    assert s.store.redis_url == "redis://env:6379/0" and s.routing.region_fallbacks == ["us-east", "ap-south"]
    assert s.listener_limits.max_headers == 50 and s.fleet.health_fall == 7
    assert GatewaySettings(redis_url=None).store.redis_url is None  # arguments still beat the environment


def test_toml_accepts_flat_keys_and_section_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        'region = "eu-west"\nport = 9000\n[store]\nsqlite_path = "/tmp/x.sqlite3"\n'
        '[[fleet.backends]]\nid = "b0"\nbase_url = "http://127.0.0.1:1"\n'
    )
    monkeypatch.setenv("EDGERUN_CONFIG", str(path))
    s = GatewaySettings()
    assert (s.routing.region, s.http.port, s.store.sqlite_path) == ("eu-west", 9000, "/tmp/x.sqlite3")
    assert [b.id for b in s.fleet.backends] == ["b0"]
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", "/tmp/env.sqlite3")  # the environment beats the file
    assert GatewaySettings().store.sqlite_path == "/tmp/env.sqlite3"


def test_one_setting_given_both_ways_is_an_error() -> None:
    with pytest.raises(ValueError, match="redis_url is set both on its own and in \\[store\\]"):
        GatewaySettings(redis_url="redis://a", store={"redis_url": "redis://b"})


def test_a_misspelt_key_inside_a_section_is_refused() -> None:
    with pytest.raises(ValidationError, match="redis_ur"):
        GatewaySettings(store={"redis_ur": "redis://a"})


def test_sections_validate_across_parts() -> None:
    with pytest.raises(ValidationError, match="share the local store's SQLite file"):
        GatewaySettings(workers=2, redis_url=None, sqlite_path=":memory:")
    file = {"workers": 2, "port": 8080, "redis_url": None, "sqlite_path": "/tmp/w.sqlite3"}
    assert not GatewaySettings(**file).store.sqlite_shared  # the supervisor's view: it opens no store
    worker = GatewaySettings(**file, worker_index=0)
    assert worker.store.sqlite_shared  # a worker shares the file (the store's own section says so)
    with pytest.raises(ValidationError, match="must exceed ledger_retention_s"):
        StoreSettings(ledger_retention_s=10, ledger_idempotency_ttl_s=5)


def test_every_setting_name_is_unique_over_the_sections() -> None:
    owners = section_of()
    assert owners["redis_url"] == "store" and owners["admin_token"] == "http" and owners["prices"] == "billing"
    assert len(owners) > 60


def test_a_backend_whose_kv_events_the_gateway_binds_refuses_several_workers() -> None:
    backend = {"id": "v", "base_url": "http://x", "kind": "vllm", "kv_events": "tcp://127.0.0.1:5557", "kv_events_bind": True}
    with pytest.raises(ValueError, match="kv_events_bind"):
        GatewaySettings(redis_url="redis://127.0.0.1:6379/0", workers=2, port=8000, backends=[backend])
    assert GatewaySettings(backends=[backend]).fleet.backends[0].event_source().bind  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "tgi"}, "choose one of"),
        ({"kind": "edgerun", "kv_events": "tcp://10.0.0.5:5557"}, "kind vllm or sglang"),
        ({"kind": "vllm", "kv_events": "tcp://*:5557"}, "the engine itself binds"),
        ({"kind": "vllm", "kv_events": "http://10.0.0.5:5557"}, "ZMQ endpoint"),
        ({"kind": "sglang", "kv_events_replay": "tcp://10.0.0.5:5558"}, "needs kv_events"),
        # ZMQ refuses these only when the stream connects: a traceback a second, for ever
        ({"kind": "vllm", "kv_events": "tcp://10.0.0.5"}, "tcp://HOST:PORT"),
        ({"kind": "vllm", "kv_events": "tcp://10.0.0.5:kv"}, "tcp://HOST:PORT"),
        ({"kind": "vllm", "kv_events": "tcp://10.0.0.5:5557", "kv_events_replay": "tcp://10.0.0.5:70000"}, "tcp://HOST:PORT"),
        ({"kind": "vllm", "kv_events_bind": True}, "kv_events_bind needs kv_events"),
    ],
)
def test_backend_kind_settings_are_checked_with_the_fix(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewaySettings(backends=[{"id": "b", "base_url": "http://x", **fields}])
