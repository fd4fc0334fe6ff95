"""One real stack for the load-test smoke runs: a smollm2 backend and a gateway on loopback,
started by the harness's own launcher (loadtests/stack.py) with a non-default routing policy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadtests.stack import Stack, StackConfig, running_stack

STACK_POLICY = "round_robin"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig(num_backends=1, policy=STACK_POLICY, workdir=tmp_path_factory.mktemp("stack"))
    with running_stack(config) as started:
        yield started
