"""A request context stamped with the current time, for tests (and benchmarks) that call the gateway's
services without an HTTP arrival."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gateway.context import Principal, RequestContext
from gateway.fleet.catalog import ModelSpec


def context_now(request_id: str, principal: Principal, model: ModelSpec, session_id: str | None = None,
                metadata: Mapping[str, Any] | None = None) -> RequestContext:
    return RequestContext(request_id, principal, model, session_id, time.perf_counter(), time.time(), metadata or {})
