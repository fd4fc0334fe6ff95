"""Fixtures every test directory may use, registered once here (pytest reads `pytest_plugins`
only from the top-level conftest): the embedded `store`, the end-to-end processes (`backend_pair`,
`gateway`) and the real vLLM (`vllm_server`, `vllm_gateway`). A conftest or module fixture of the
same name takes precedence.

The fast lane (`make test-fast`, `pytest --fast`) runs every test that starts no process and loads no
real model: it leaves out the tests marked `process` or `slow`. A test is marked `process` when it
asks for a fixture in `PROCESS_FIXTURES`, and `slow` when it asks for one in `MODEL_FIXTURES` (both
here, at collection), or when its module or function says so.
In the fast lane starting a process fails the test that tried, so a test that starts one without
the mark cannot pass there unnoticed.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, NoReturn

import pytest

pytest_plugins = ("tests.gateway.fixtures_store", "tests.gateway.fixtures_e2e", "tests.vllm.fixtures")

# fixtures that start a process (a backend, a gateway, a stub, Redis when none answers, vLLM, a load-test stack)
PROCESS_FIXTURES = frozenset({
    "backend_pair", "stub_backend", "slow_stub_backend", "embedding_backend", "redis_url", "stack",
    "vllm_server", "vllm_gateway",
})


# fixtures that load the real model (SmolLM2) in this process: what asks for one is `slow`
MODEL_FIXTURES = frozenset({"smollm2_runner", "smollm2_fast_runner", "smollm2_default_runner"})


class ProcessInFastLane(RuntimeError):
    """A test in the fast lane started a process."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="the fast lane: leave out the tests marked `process` or `slow`; fail any other that starts a process")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        config.stash[_GUARD] = guard = pytest.MonkeyPatch()
        for owner, name in ((subprocess.Popen, "__init__"), (os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp")):
            guard.setattr(owner, name, _refuse(f"{owner.__name__}.{name}"))


def pytest_unconfigure(config: pytest.Config) -> None:
    guard = config.stash.get(_GUARD, None)
    if guard is not None:
        guard.undo()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if PROCESS_FIXTURES & fixtures:
            item.add_marker(pytest.mark.process)
        if MODEL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
    if config.getoption("fast"):
        left_out = [item for item in items if item.get_closest_marker("process") or item.get_closest_marker("slow")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            dropped = set(left_out)
            items[:] = [item for item in items if item not in dropped]


_GUARD = pytest.StashKey[pytest.MonkeyPatch]()


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise ProcessInFastLane(f"{what}: this test starts a process, which the fast lane (--fast) does not run; "
                                "mark it `process` (pytestmark = pytest.mark.process) or ask for a fixture that starts one")

    return refuse
