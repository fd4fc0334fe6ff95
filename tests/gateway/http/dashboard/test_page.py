"""The dashboard page and its files: served from the package, under a strict CSP, nothing else reachable."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.http.app import create_app
from gateway.http.dashboard.page import STATIC
from tests.gateway.fixtures_e2e import gateway_settings


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings(tmp_path_factory.mktemp("page"), []))) as opened:
        yield opened


def test_the_page_loads_only_its_own_files_under_a_strict_csp(client: TestClient) -> None:
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text and " on" + "click=" not in page.text  # no inline script to allow
    linked = re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', page.text)
    assert len(linked) == 4 and not re.search(r'(?:src|href)="https?:', page.text)  # no CDN
    for path in linked:
        answer = client.get(path)
        assert answer.status_code == 200 and answer.content, path
        assert answer.headers["content-security-policy"] == csp


@pytest.mark.parametrize("name", ["nope.js", "..%2Fpage.py", "%2E%2E%2F__init__.py", "VENDORED"])
def test_nothing_outside_the_static_folder_is_served(client: TestClient, name: str) -> None:
    answer = client.get(f"/dashboard/static/{name}")
    assert answer.status_code == 404 and answer.json()["errors"][0]["code"] == 7000


def test_the_vendored_files_are_the_ones_vendored_md_names() -> None:
    vendored = (STATIC / "VENDORED.md").read_text()
    hashes = dict((name, digest) for digest, name in re.findall(r"^\s+([0-9a-f]{64})  (\S+)$", vendored, re.M))
    assert set(hashes) == {"uPlot.iife.min.js", "uPlot.min.css"}
    for name, digest in hashes.items():
        assert hashlib.sha256(Path(STATIC / name).read_bytes()).hexdigest() == digest, name
    assert "MIT" in (STATIC / "uPlot.LICENSE.txt").read_text()
