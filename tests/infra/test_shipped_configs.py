"""The shipped deployment files keep backends closed: a backend listening beyond loopback has a
key, every gateway sends it, and no backend port is published to the host. Gateways serve their
admin API and /metrics on a separate listener that only the host's loopback (compose) or
labelled pods (k8s) reach."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from cli.backend import add_arguments, build_settings

INFRA = Path(__file__).resolve().parents[2] / "infra"


def is_backend(command: list[str]) -> bool:
    return command[:2] == ["edgerun", "backend"]


def listens_beyond_loopback(command: list[str]) -> bool:
    return "--host" in command and command[command.index("--host") + 1] not in ("127.0.0.1", "localhost", "::1")


def test_compose_backends_need_the_key_the_gateways_send() -> None:
    services: dict[str, Any] = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    backends = {n: s for n, s in services.items() if is_backend(s.get("command", []))}
    gateways = {n: s for n, s in services.items() if s.get("command", [])[:2] == ["edgerun", "serve"]}
    assert backends and gateways
    for name, service in backends.items():
        assert listens_beyond_loopback(service["command"]), name  # reached by the gateways' containers
        assert service["environment"]["EDGERUN_API_KEY"].startswith("${EDGERUN_BACKEND_API_KEY:?"), name
        assert "ports" not in service, name  # never published on the host
    for name, service in gateways.items():
        assert service["environment"]["EDGERUN_BACKEND_API_KEY"].startswith("${EDGERUN_BACKEND_API_KEY:?"), name


def backend_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_a_regions_backends_share_its_kv_pool_on_the_compose_network_only() -> None:
    services: dict[str, Any] = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    pool = services["kv-pool-eu-west"]
    assert "ports" not in pool and pool["command"][0] == "mooncake_master"
    port = next(a.split("=")[1] for a in pool["command"] if a.startswith("--rpc_port="))
    sharing = {n: s["command"] for n, s in services.items() if "--kv-region-pool" in s.get("command", [])}
    assert sorted(sharing) == ["backend-eu-west-a", "backend-eu-west-b"]
    for name, command in sharing.items():
        settings = build_settings(backend_parser().parse_args(command[2:]))  # refused if a part is missing
        assert settings.kv_region_pool_master == f"kv-pool-eu-west:{port}" and settings.region == "eu-west"
        assert settings.kv_advertise_host == name  # the other backends reach its segment by its service name


def k8s_documents(manifest: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((INFRA / "k8s" / manifest).read_text()))


def k8s_env(manifest: str) -> dict[str, Any]:
    [deployment, *_] = [d for d in k8s_documents(manifest) if "template" in d["spec"]]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def test_k8s_backends_and_gateways_share_the_key_from_one_secret() -> None:
    backend = k8s_env("backend.yaml")["EDGERUN_API_KEY"]["valueFrom"]["secretKeyRef"]
    gateway = k8s_env("gateway.yaml")["EDGERUN_BACKEND_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert backend == gateway == {"name": "edgerun-backend", "key": "key"}
    policies = [d for d in k8s_documents("backend.yaml") if d["kind"] == "NetworkPolicy"]
    [ingress] = policies[0]["spec"]["ingress"]
    assert ingress["from"] == [{"podSelector": {"matchLabels": {"app": "edgerun-gateway"}}}]


def test_the_disaggregated_examples_list_pools_and_keep_backends_closed(monkeypatch: Any) -> None:
    from gateway.settings import GatewaySettings

    for name, roles in (("gateway.disagg.toml", ["prefill", "decode", "decode"]),
                        ("gateway.trtllm-disagg.toml", ["prefill", "prefill", "decode", "decode"])):
        monkeypatch.setenv("EDGERUN_CONFIG", str(INFRA / name))
        settings = GatewaySettings()
        assert [b.role for b in settings.fleet.backends] == roles, name
    services: dict[str, Any] = yaml.safe_load((INFRA / "compose.disagg.yaml").read_text())["services"]
    backends = {n: s for n, s in services.items() if is_backend(s.get("command", []))}
    assert {s["command"][s["command"].index("--role") + 1] for s in backends.values()} == {"prefill", "decode"}
    for name, service in backends.items():
        assert service["environment"]["EDGERUN_API_KEY"].startswith("${EDGERUN_BACKEND_API_KEY:?"), name
        assert "ports" not in service, name
    assert services["backend-prefill-a"]["environment"]["EDGERUN_KV_ADVERTISE_HOST"] == "backend-prefill-a"


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_gateways_publish_their_admin_listener_on_loopback_only() -> None:
    services: dict[str, Any] = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    gateways = {n: s for n, s in services.items() if s.get("command", [])[:2] == ["edgerun", "serve"]}
    for name, service in gateways.items():
        admin_port = option(service["command"], "--admin-port")
        assert admin_port != option(service["command"], "--port"), name
        admin_published = [p for p in service["ports"] if p.endswith(f":{admin_port}")]
        assert admin_published and all(p.startswith("127.0.0.1:") for p in admin_published), name


def test_k8s_admin_port_has_its_own_service_and_only_labelled_pods_reach_it() -> None:
    documents = k8s_documents("gateway.yaml")
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    admin_port = int(option(container["command"], "--admin-port"))
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    assert all(p["targetPort"] != admin_port for p in services["edgerun-gateway"]["spec"]["ports"])
    assert [p["port"] for p in services["edgerun-gateway-admin"]["spec"]["ports"]] == [admin_port]
    [policy] = [d for d in documents if d["kind"] == "NetworkPolicy"]
    admin_rules = [r for r in policy["spec"]["ingress"] if {"port": admin_port} in r["ports"]]
    assert admin_rules == [
        {"from": [{"podSelector": {"matchLabels": {"edgerun-admin": "true"}}}], "ports": [{"port": admin_port}]}
    ]


def test_the_vllm_example_matches_its_gateway_config_and_keeps_the_servers_closed(monkeypatch: Any) -> None:
    from gateway.settings import GatewaySettings

    services: dict[str, Any] = yaml.safe_load((INFRA / "compose.vllm.yaml").read_text())["services"]
    servers = {n: s for n, s in services.items() if s.get("image", "").startswith("vllm/vllm-openai:")}
    assert sorted(servers) == ["vllm-a", "vllm-b"]
    monkeypatch.setenv("EDGERUN_CONFIG", str(INFRA / "gateway.vllm.toml"))
    settings = GatewaySettings()
    [model] = settings.fleet.models
    backends = {b.base_url.removeprefix("http://").removesuffix(":8000"): b for b in settings.fleet.backends}
    assert sorted(backends) == sorted(servers)
    for name, server in servers.items():
        command = server["command"]
        # billed cached tokens need --enable-prompt-tokens-details; the prefix index, the KV events
        assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(command), name
        events = json.loads(option(command, "--kv-events-config"))
        assert backends[name].kind == "vllm", name
        assert backends[name].kv_events == events["endpoint"].replace("*", name), name  # vLLM binds, the gateway connects
        assert backends[name].kv_events_replay == events["replay_endpoint"].replace("*", name), name
        assert option(command, "--served-model-name") == model.backend_model, name
        assert int(option(command, "--max-model-len")) == model.context_length, name
        assert option(command, "--model") == str(model.tokenizer_dir), name  # the checkpoint the gateway reads too
        assert server["environment"]["VLLM_API_KEY"].startswith("${EDGERUN_BACKEND_API_KEY:?"), name
        assert "ports" not in server, name
    assert services["gateway"]["environment"]["EDGERUN_BACKEND_API_KEY"].startswith("${EDGERUN_BACKEND_API_KEY:?")
