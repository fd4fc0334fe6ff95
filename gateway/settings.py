"""Settings of a gateway process: one frozen object built at start-up and passed down.

`GatewaySettings` composes one section per part of the gateway, each a small model owned by
that part, and each part is handed only its own section:

    store            gateway/store/settings.py        StoreSettings    (Redis or SQLite, indexes, ledger archive)
    http             gateway/http/settings.py         HttpSettings     (listeners, admin, metrics, drain, workers)
    listener_limits  gateway/http/listener_limits.py  ListenerLimits   (what one connection may cost)
    fleet            gateway/fleet/settings.py        FleetSettings    (models, backends, health, breaker)
    routing          gateway/pipeline/settings.py     RoutingSettings  (regions, policy, cache salt)
    limits           gateway/pipeline/settings.py     LimitSettings    (tenant concurrency, setup, offload, deadline)
    disagg           gateway/pipeline/settings.py     DisaggSettings   (prefill/decode flow)
    batch            gateway/pipeline/settings.py     BatchSettings    (the asynchronous batch API)
    finetunes        gateway/pipeline/settings.py     FinetuneSettings (tenants' LoRA adapters)
    billing          gateway/billing/settings.py      BillingSettings  (prices, history, spool)
    logging          here                             LoggingSettings  (level, JSON)

Sources, highest first: constructor arguments, `EDGERUN_*` environment variables, the TOML file
named by `EDGERUN_CONFIG`, then the defaults. Every setting has one name, unique over all
sections, and that name works everywhere: `EDGERUN_REDIS_URL=redis://10.0.0.5:6379/0`, a flat
`redis_url = "..."` in the TOML file, a `[store]` table holding `redis_url`, or
`GatewaySettings(redis_url=...)`. The sectioned forms (`[store]` in TOML, `EDGERUN_STORE__REDIS_URL`,
`GatewaySettings(store=StoreSettings(...))`) work too. The same setting given both ways in one
source is an error, since which one was meant cannot be known. A key that names no setting is
ignored at the top level (other tools read the same environment) but refused inside a section.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from contracts.settings import TomlSettings
from gateway.billing.settings import BillingSettings
from gateway.fleet.settings import FleetSettings
from gateway.http.listener_limits import ListenerLimits
from gateway.http.settings import HttpSettings
from gateway.pipeline.settings import BatchSettings, DisaggSettings, FinetuneSettings, LimitSettings, RoutingSettings
from gateway.store.settings import StoreSettings


class LoggingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    log_level: str = "info"
    log_json: bool = True


class GatewaySettings(TomlSettings):
    store: StoreSettings = Field(default_factory=StoreSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    listener_limits: ListenerLimits = Field(default_factory=ListenerLimits)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    disagg: DisaggSettings = Field(default_factory=DisaggSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    finetunes: FinetuneSettings = Field(default_factory=FinetuneSettings)
    billing: BillingSettings = Field(default_factory=BillingSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @classmethod
    def arrange_sources(
        cls, sources: tuple[PydanticBaseSettingsSource, ...], env_settings: PydanticBaseSettingsSource
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Each source's flat settings moved into their sections; the environment's also read flat."""
        flat_env = EnvSettingsSource(_flat_settings_class(), case_sensitive=False, env_prefix="EDGERUN_")
        return tuple(
            SectionedSource(cls, source, extra=flat_env if source is env_settings else None) for source in sources
        )

    @model_validator(mode="after")
    def _workers_share_a_store(self) -> GatewaySettings:
        workers, store = self.http.workers, self.store
        if workers > 1 and store.redis_url is None and store.sqlite_path == ":memory:":
            raise ValueError(
                f"workers={workers} share the local store's SQLite file (in its shared mode): give a file "
                "(EDGERUN_SQLITE_PATH), not ':memory:', or point the gateway at Redis (EDGERUN_REDIS_URL)"
            )
        if workers > 1 and self.http.port == 0:
            raise ValueError("workers > 1 share one port: give a port (not 0)")
        binding = [b.id for b in self.fleet.backends if b.kv_events_bind]
        if workers > 1 and binding:
            raise ValueError(
                f"backends {binding} have kv_events_bind = true, but one address binds in one process only and "
                f"workers={workers}: start the engine with a tcp://*:PORT (or ipc://) KV event endpoint, so it "
                "binds and every worker connects, and drop kv_events_bind"
            )
        if store.is_regional and store.region_name is None:  # leases are taken under the gateway's region
            store = store.model_copy(update={"region_name": self.routing.region})
            object.__setattr__(self, "store", store)
        is_worker = self.http.worker_index is not None
        if is_worker and workers > 1 and store.redis_url is None:
            # the workers of `serve --workers N` without Redis share the SQLite file; decided here,
            # where both sections are known
            object.__setattr__(self, "store", store.model_copy(update={"sqlite_shared": True}))
        return self


def sections() -> dict[str, type[BaseModel]]:
    """Section name -> its model, as `GatewaySettings` composes them."""
    found: dict[str, type[BaseModel]] = {}
    for name, info in GatewaySettings.model_fields.items():
        assert isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
        found[name] = info.annotation
    return found


@cache
def section_of() -> dict[str, str]:
    """Setting name -> the section that owns it (names are unique over all sections)."""
    owners: dict[str, str] = {}
    for section, model in sections().items():
        for name in model.model_fields:
            assert name not in owners, f"setting {name} is in both [{owners[name]}] and [{section}]"
            owners[name] = section
    return owners


def nest(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with every flat setting moved into its section; one given both ways is an error."""
    owners = section_of()
    nested = {key: value for key, value in data.items() if key not in owners}
    for key, value in data.items():
        section = owners.get(key)
        if section is None:
            continue
        block = nested.get(section)
        if isinstance(block, BaseModel):
            block = block.model_dump(exclude_unset=True)
        block = dict(block) if isinstance(block, Mapping) else {}
        if key in block:
            raise ValueError(f"{key} is set both on its own and in [{section}]: keep one")
        block[key] = value
        nested[section] = block
    return nested


class SectionedSource(PydanticBaseSettingsSource):
    """Another source's values, flat settings moved into their sections (`extra`: flat values
    read by a second source of the same priority, e.g. `EDGERUN_REDIS_URL` beside `EDGERUN_STORE__...`)."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        inner: PydanticBaseSettingsSource,
        extra: PydanticBaseSettingsSource | None = None,
    ) -> None:
        super().__init__(settings_cls)
        self.inner = inner
        self.extra = extra

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ asks the inner sources

    def __call__(self) -> dict[str, Any]:
        data = dict(self.inner())
        if self.extra is not None:
            for key, value in self.extra().items():
                if key in data:
                    raise ValueError(f"{key} is set twice in the environment")
                data[key] = value
        return nest(data)

    def __repr__(self) -> str:
        return f"SectionedSource({self.inner!r})"


@cache
def _flat_settings_class() -> type[BaseSettings]:
    """A settings class with every section's fields at the top level: pydantic-settings reads
    `EDGERUN_<NAME>` for each (decoding JSON for lists and tables) and nothing is validated here."""
    fields: dict[str, Any] = {
        name: (info.annotation, None) for model in sections().values() for name, info in model.model_fields.items()
    }
    flat: type[BaseSettings] = create_model("FlatGatewaySettings", __base__=BaseSettings, **fields)
    return flat
