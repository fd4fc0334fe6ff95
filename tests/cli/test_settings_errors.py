"""A setting refused at start-up is named, never printed: the value may be a secret, and start-up
errors land in logs. Real `edgerun serve` and `edgerun backend` processes, refused before serving."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cli.processes import ROOT, child_env

pytestmark = pytest.mark.slow
SHORT = {  # each too short for its rule, each distinct so that any echo is found
    "EDGERUN_ADMIN_TOKEN": "short-admin-token-7c1e",
    "EDGERUN_METRICS_TOKEN": "metrics-9a",
    "EDGERUN_CACHE_SALT_SECRET": "salt-4d2b",
    "EDGERUN_BACKEND_API_KEY": "bk-key-55e0",
}


def refused(command: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "cli", command, "--port", "0"],
        cwd=ROOT, env=child_env(env, keep_edgerun=False, threads=None), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_gateway_refusing_short_secrets_names_them_without_their_values() -> None:
    said = refused("serve", SHORT)
    for name in ("admin_token", "metrics_token", "cache_salt_secret", "backend_api_key"):
        assert name in said, said  # the setting and what to do are still said
    assert "openssl rand -hex 32" in said
    for secret in SHORT.values():
        assert secret not in said, said


def test_a_backend_refusing_its_key_names_it_without_its_value() -> None:
    said = refused("backend", {"EDGERUN_API_KEY": "bk-short-3f"})
    assert "api_key (EDGERUN_API_KEY) must be at least 16 characters" in said, said
    assert "bk-short-3f" not in said


def test_an_error_about_the_whole_configuration_does_not_print_it() -> None:
    password = "redis-password-0b7d41"
    env = {"EDGERUN_REDIS_URL": f"redis://:{password}@127.0.0.1:1/0", "EDGERUN_WORKERS": "2"}
    said = refused("serve", env)  # --port 0 with two workers: refused by a rule over the whole settings
    assert "workers > 1 share one port" in said, said
    assert password not in said and "input_value" not in said
