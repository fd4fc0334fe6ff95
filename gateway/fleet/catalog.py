"""The model catalog: Workers AI model ids -> what backends call the model, and who serves it.

Model ids follow Workers AI's naming (`@cf/<author>/<name>`). The default catalog has one model,
`@cf/huggingface/smollm2-135m-instruct` (SmolLM2-135M-Instruct, which the built-in backend loads
as `--model smollm2`). Deployments list models and backends in the TOML file:

    [[models]]
    id = "@cf/huggingface/smollm2-135m-instruct"
    backend_model = "smollm2"

    [[backends]]
    id = "eu-west-1"
    base_url = "http://10.0.0.5:8100"
    region = "eu-west"
    models = ["@cf/huggingface/smollm2-135m-instruct"]

    [[backends]]                          # a vLLM server (kinds: backends/client/kinds)
    id = "vllm-a"
    base_url = "http://10.0.0.6:8000"
    kind = "vllm"
    kv_events = "tcp://10.0.0.6:5557"     # its --kv-events-config endpoint, as the gateway reaches it
    kv_events_replay = "tcp://10.0.0.6:5558"

Aliases let clients that default to other Workers AI names reach a served model: the operator
maps a public name onto a catalog id (`model_aliases` in the settings):

    [model_aliases]
    "@cf/meta/llama-3.1-8b-instruct" = "@cf/huggingface/smollm2-135m-instruct"

A request naming an alias runs, is authorised, priced and recorded as the model it names; answers
carry the served id (as OpenAI answers `gpt-4o` with the dated model that ran). `models/search`
lists each alias with an `alias_of` property; OpenAI's `GET /v1/models` lists aliases as models.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from backends.client import Endpoint
from backends.client.kinds import DEFAULT_KIND, kind_of
from backends.client.zmq_events import EventSource
from contracts.lora_adapter import BaseShape
from gateway.errors import NoSuchModel

DEFAULT_MODEL_ID = "@cf/huggingface/smollm2-135m-instruct"
EMBEDDING_MODEL_ID = "@cf/sentence-transformers/all-minilm-l6-v2"  # what `edgerun dev` serves for embeddings
EMBEDDING_TASK = "Text Embeddings"  # a model with this task is encoded by embedding backends, never generated


class LoraShape(BaseModel):
    """What a LoRA adapter of a model must fit (its Llama shape): set on a model that accepts adapters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)

    def base_shape(self) -> BaseShape:
        return BaseShape.llama(self.num_layers, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                               self.intermediate_size)


SMOLLM2_LORA_SHAPE = LoraShape(num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
                               intermediate_size=1536)


class ModelSpec(BaseModel):
    """One model the gateway offers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str  # the Workers AI-style id clients send
    backend_model: str  # the `model` field sent to backends
    description: str = ""
    task: str = "Text Generation"
    author: str = ""
    context_length: int | None = Field(default=None, ge=1)  # None: the backend's max_model_len
    # prefix-hash block: must equal the KV block size of edgerun backends (vLLM's and SGLang's blocks
    # are re-hashed from their tokens: gateway/fleet/engine_index.py)
    block_size: int = Field(default=16, ge=1)
    # A local Hugging Face tokenizer (tokenizer.json, tokenizer_config.json with chat_template) for
    # third-party backends that do not serve GET /edgerun/v1/tokenizer.
    tokenizer_dir: Path | None = None
    # Deprecated (a server's setting: [[backends]] return_token_ids, default by kind). False here still
    # keeps every backend of this model from being asked for each chunk's token ids.
    return_token_ids: bool = True
    # Tenants' LoRA finetunes of this model (gateway/pipeline/finetunes.py): the shape an adapter must fit;
    # None: the model takes no adapters. Its backends must serve adapters (edgerun with a lora_dir).
    lora: LoraShape | None = None


class BackendSpec(BaseModel):
    """One backend server, its kind, the catalog models it serves and where its KV events come from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    base_url: str
    region: str = "local"
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    models: list[str] = Field(default_factory=lambda: [DEFAULT_MODEL_ID])
    # the server's kind (backends/client/kinds): edgerun, trtllm, vllm, sglang or openai
    kind: str = DEFAULT_KIND
    # vLLM / SGLang: their ZMQ KV event publisher ("tcp://HOST:PORT", the endpoint of their
    # --kv-events-config, with the host the gateway reaches), its replay socket and topic
    kv_events: str | None = None
    kv_events_replay: str | None = None
    kv_events_topic: str = ""
    # the gateway binds kv_events and the engine connects to it (the engine's endpoint names a host,
    # not *): one gateway process only, since one address binds once
    kv_events_bind: bool = False
    # ask for each chunk's token ids (`return_token_ids`); None: the kind's default
    return_token_ids: bool | None = None
    # vLLM serving tenants' finetunes: the gateway's finetunes_dir as this server reads it (a shared
    # volume; the same path on one machine). The gateway loads adapter X from `<lora_dir>/X` there.
    lora_dir: str | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        kind_of(value)  # a ValueError naming the kinds
        return value

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq_endpoint(cls, value: str | None) -> str | None:
        # checked here: ZMQ refuses a malformed endpoint only when the stream connects, in the background
        if value is not None and not (_is_tcp_endpoint(value) or (value.startswith("ipc://") and value != "ipc://")):
            raise ValueError(
                f"{value!r}: give the publisher's ZMQ endpoint, tcp://HOST:PORT (e.g. tcp://10.0.0.5:5557, a port "
                "from 1 to 65535) or ipc:///path"
            )
        return value

    @model_validator(mode="after")
    def _events_fit_kind(self) -> BackendSpec:
        server = kind_of(self.kind)
        if self.kv_events is not None and server.kv_events != "zmq":
            raise ValueError(f"backend {self.id!r}: kv_events is for kind vllm or sglang, not {self.kind!r}")
        for name, value in (("kv_events_replay", self.kv_events_replay), ("kv_events_bind", self.kv_events_bind or None)):
            if value is not None and self.kv_events is None:
                raise ValueError(f"backend {self.id!r}: {name} needs kv_events (the engine's publisher endpoint)")
        for name, value in (("kv_events", None if self.kv_events_bind else self.kv_events), ("kv_events_replay", self.kv_events_replay)):
            if value is not None and "*" in value:
                raise ValueError(
                    f"backend {self.id!r}: {name} = {value!r}: the gateway connects there, so name the host it "
                    "reaches the engine at (the engine itself binds tcp://*:PORT)"
                )
        return self

    def endpoint(self) -> Endpoint:
        return Endpoint(
            id=self.id,
            base_url=self.base_url,
            region=self.region,
            role=self.role,
            kind=self.kind,
            return_token_ids=self.return_token_ids,
            lora_dir=self.lora_dir,
        )

    def event_source(self) -> EventSource | None:
        """Where this backend publishes KV events over ZMQ (None: it does not, or polls)."""
        if self.kv_events is None:
            return None
        return EventSource(self.kv_events, self.kv_events_replay, self.kv_events_topic, bind=self.kv_events_bind)


def _is_tcp_endpoint(value: str) -> bool:
    """`tcp://HOST:PORT`: a host (a name, an address, [an IPv6 address], or * to bind), a port from 1 to 65535."""
    host, _, port = value.removeprefix("tcp://").rpartition(":")
    is_host = bool(host) and not any(c.isspace() or c == "/" for c in host)
    return value.startswith("tcp://") and is_host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535


def default_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            id=DEFAULT_MODEL_ID,
            backend_model="smollm2",
            author="huggingface",
            description="SmolLM2-135M-Instruct: a small Llama-architecture instruct model (Q4_1 GGUF).",
            lora=SMOLLM2_LORA_SHAPE,
        )
    ]


def embedding_model() -> ModelSpec:
    """all-MiniLM-L6-v2, as `edgerun backend --engine embedding` serves it by default."""
    return ModelSpec(
        id=EMBEDDING_MODEL_ID,
        backend_model="all-minilm-l6-v2",
        task=EMBEDDING_TASK,
        author="sentence-transformers",
        description="all-MiniLM-L6-v2: 384-dimensional sentence embeddings (BERT, mean pooling, normalised).",
    )


@dataclass(frozen=True, slots=True)
class Catalog:
    """Read-only lookups over the configured models and backends."""

    models: tuple[ModelSpec, ...]
    backends: tuple[BackendSpec, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)  # public name -> catalog model id
    loaded_at: int = field(default_factory=lambda: int(time.time()), compare=False)  # OpenAI's model `created`
    # each model's endpoints, built once: every request asks for them
    _endpoints: Mapping[str, tuple[Endpoint, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_model: dict[str, list[Endpoint]] = {}
        for backend in self.backends:
            endpoint = backend.endpoint()
            for model_id in dict.fromkeys(backend.models):
                by_model.setdefault(model_id, []).append(endpoint)
        object.__setattr__(self, "_endpoints", {model_id: tuple(found) for model_id, found in by_model.items()})

    @classmethod
    def build(
        cls, models: Sequence[ModelSpec], backends: Sequence[BackendSpec], aliases: Mapping[str, str] | None = None
    ) -> Catalog:
        ids = [m.id for m in models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"model ids must be unique, got {ids}")
        aliases = dict(aliases or {})
        for alias, target in aliases.items():
            if alias in ids:
                raise ValueError(f"model alias {alias!r} is already a model id: an alias must name no model")
            if target not in ids:
                raise ValueError(f"model alias {alias!r} names {target!r}, which is not in the catalog: one of {ids}")
        backend_ids = [b.id for b in backends]
        if len(set(backend_ids)) != len(backend_ids):
            raise ValueError(f"backend ids must be unique, got {backend_ids}")
        for backend in backends:
            unknown = set(backend.models) - set(ids)
            if unknown:
                raise ValueError(f"backend {backend.id!r} serves models not in the catalog: {sorted(unknown)}")
        return cls(tuple(models), tuple(backends), aliases)

    def get(self, model_id: str) -> ModelSpec:
        """The model `model_id` names: a catalog id or an alias of one."""
        model_id = self.aliases.get(model_id, model_id)
        for model in self.models:
            if model.id == model_id:
                return model
        raise NoSuchModel(f"No such model {model_id} or task", param="model")

    def endpoints(self, model_id: str) -> list[Endpoint]:
        """Every backend serving `model_id`, as client endpoints, in configuration order."""
        return list(self._endpoints.get(model_id, ()))

    def all_endpoints(self) -> list[Endpoint]:
        return [b.endpoint() for b in self.backends]

    def names(self) -> list[tuple[str, ModelSpec]]:
        """Every name a client may send, with the model it runs: the catalog ids, then the aliases."""
        return [(model.id, model) for model in self.models] + [(alias, self.get(alias)) for alias in self.aliases]

    def openai_model(self, name: str) -> dict[str, Any]:
        """OpenAI's model object for `name` (an id or an alias), owned by the served model's author."""
        model = self.get(name)
        owner = model.author or _author(model.id) or "edgerun"
        return {"id": name, "object": "model", "created": self.loaded_at, "owned_by": owner}

    def search(
        self, *, search: str | None = None, task: str | None = None, author: str | None = None,
        capabilities: str | None = None,
    ) -> list[dict[str, Any]]:
        """Models in the Workers AI model-search shape, filtered like its query parameters.

        As upstream, `id` is a UUID and `name` the model id clients send; ours are UUIDv5 of the
        name, so they are stable across restarts and gateways.
        """
        found = []
        for name, model in self.names():
            description = model.description if name == model.id else f"Alias of {model.id}. {model.description}"
            if search and search.lower() not in f"{name} {description}".lower():
                continue
            if task and task.lower() != model.task.lower():
                continue
            if author and author.lower() not in (model.author.lower(), _author(name)):
                continue
            if capabilities and capabilities.lower() == "lora" and model.lora is None:  # those that take finetunes
                continue
            properties = []
            if model.context_length:
                properties.append({"property_id": "context_window", "value": str(model.context_length)})
            if name != model.id:
                properties.append({"property_id": "alias_of", "value": model.id})
            if model.lora is not None:
                properties.append({"property_id": "lora", "value": "true"})
            found.append(
                {
                    "id": str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
                    "source": 1,
                    "name": name,
                    "description": description,
                    "task": {
                        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, model.task)),
                        "name": model.task,
                        "description": "",
                    },
                    "tags": [],
                    "properties": properties,
                }
            )
        return found


def _author(name: str) -> str:
    """`meta` for `@cf/meta/llama-3.1-8b-instruct`: the author segment of a Workers AI name."""
    parts = name.split("/")
    return parts[1].lower() if len(parts) == 3 else ""
