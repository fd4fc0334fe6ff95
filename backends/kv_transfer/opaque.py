"""The context step's opaque state: what a decode backend needs to pull a request's KV.

trtllm-serve carries it as `disaggregated_params.encoded_opaque_state` (base64); ours is base64
of compact JSON. Nothing in it is a secret - the pull itself is authenticated (tcp.py) - but a
decode backend refuses one whose fingerprint differs from its own before it writes any byte.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, field
from typing import Any

VERSION = 1


@dataclass(slots=True, frozen=True)
class OpaqueState:
    transport: str  # "tcp" or "mooncake"
    host: str  # the exporter's control endpoint (tcp.py)
    port: int
    pin_id: int
    num_tokens: int  # positions [0, num_tokens) are pinned
    num_blocks: int
    fingerprint: str
    extra: dict[str, Any] = field(default_factory=dict)  # transport specifics (mooncake: session, addresses)

    def encode(self) -> str:
        raw = json.dumps({"v": VERSION, **asdict(self)}, separators=(",", ":")).encode()
        return base64.b64encode(raw).decode()

    @classmethod
    def decode(cls, encoded: str) -> OpaqueState:
        """Parse `encoded_opaque_state`; ValueError says what is wrong with it."""
        try:
            data = json.loads(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise ValueError("encoded_opaque_state is not base64 JSON from an edgerun context step") from exc
        if not isinstance(data, dict) or data.pop("v", None) != VERSION:
            raise ValueError(f"encoded_opaque_state is not version {VERSION} of edgerun's KV state")
        try:
            state = cls(**data)
        except TypeError as exc:
            raise ValueError(f"encoded_opaque_state has the wrong fields: {exc}") from exc
        ints = (state.port, state.pin_id, state.num_tokens, state.num_blocks)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            raise ValueError("encoded_opaque_state holds a negative or non-integer count")
        if not isinstance(state.host, str) or not isinstance(state.fingerprint, str) or not isinstance(state.extra, dict):
            raise ValueError("encoded_opaque_state has a field of the wrong type")
        return state
