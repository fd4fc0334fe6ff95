"""The kinds of backend server the gateway speaks to, one module each; adding one is a module
with its `BackendKind` plus its line in `KINDS`.

    base.py     `BackendKind`: what a kind decides (body shape, routes, what it reports)
    edgerun.py  edgerun's own backend
    openai.py   a plain OpenAI-compatible server
    vllm.py     vLLM
    sglang.py   SGLang
    trtllm.py   trtllm-serve
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from backends.client.kinds.base import BackendKind, KVEventDelivery
from backends.client.kinds.edgerun import EDGERUN
from backends.client.kinds.openai import OPENAI
from backends.client.kinds.sglang import SGLANG
from backends.client.kinds.trtllm import TRTLLM
from backends.client.kinds.vllm import VLLM

DEFAULT_KIND = EDGERUN.name
KINDS: Mapping[str, BackendKind] = MappingProxyType({k.name: k for k in (EDGERUN, TRTLLM, VLLM, SGLANG, OPENAI)})


def kind_of(name: str) -> BackendKind:
    """The kind called `name`; a ValueError naming the valid ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown backend kind {name!r}; choose one of {sorted(KINDS)}") from None


__all__ = ["DEFAULT_KIND", "KINDS", "BackendKind", "KVEventDelivery", "kind_of"]
