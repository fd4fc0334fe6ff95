"""Who a request is for and what it asked: the one context every part of the gateway reads.

The HTTP layer authenticates the caller (`Principal`) and, once the model is known, builds one
`RequestContext`. Generation and embedding, routing (`Flight.ctx`), the disaggregated flow,
metering (`MeteredRequest.ctx`) and the ledger record, and the log lines of all of them read
that object; none keeps its own copy of the request id, tenant, key, account, model, session or
arrival time. A part keeps only what is its own (a flight its chosen backends, metering its
reservation and timings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.fleet.catalog import ModelSpec
from gateway.store.models import ApiKey, Tenant


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its key, the key's tenant, and the account in the URL."""

    key: ApiKey
    tenant: Tenant
    account_id: str


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One client request, built once when its caller and model are known, then passed down."""

    request_id: str  # the gateway's id (`cf-ray`): the ledger's key, and the backend's request id
    principal: Principal
    model: ModelSpec
    session_id: str | None  # the client's x-session-affinity
    arrived_perf: float  # time.perf_counter() at arrival: time to first token and the request deadline
    arrived_at: float  # time.time() at arrival: the ledger record's start and the budget month
    metadata: Mapping[str, Any] = field(default_factory=dict)  # cf-aig-metadata (+ client_request_id, lora)
    # the tenant's LoRA finetune it runs under (its id: the backend's adapter name), None for the base model
    adapter: str | None = None

    @property
    def tenant_id(self) -> str:
        return self.principal.tenant.id

    @property
    def model_id(self) -> str:
        return self.model.id
