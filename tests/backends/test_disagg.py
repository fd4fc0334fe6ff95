"""The backend's disaggregated-serving rules that need no model: roles, the opaque state, the pin registry."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backends.kv_transfer.errors import PinNotFound
from backends.kv_transfer.exports import KVExports
from backends.kv_transfer.opaque import OpaqueState
from backends.server.disagg import check_role
from backends.server.errors import BadRequest, NotImplementedFeature
from backends.server.protocol import DisaggregatedParams
from backends.settings import BackendSettings
from engines.base import KVPin
from engines.builtin.config import EngineConfig


def state(role: str, has_kv: bool = True) -> SimpleNamespace:
    return SimpleNamespace(settings=SimpleNamespace(role=role), kv=object() if has_kv else None)


def params(kind: str) -> DisaggregatedParams:
    return DisaggregatedParams(request_type=kind)


def test_roles_take_only_their_step() -> None:
    with pytest.raises(BadRequest, match="--role prefill: send generation_only requests to a decode or mixed"):
        check_role(state("prefill"), params("generation_only"))  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="--role decode: send context_only requests to a prefill or mixed"):
        check_role(state("decode"), params("context_only"))  # type: ignore[arg-type]
    for role in ("prefill", "decode", "mixed"):  # ordinary requests everywhere (local prefill)
        check_role(state(role), None)  # type: ignore[arg-type]
    check_role(state("mixed"), params("context_only"))  # type: ignore[arg-type]
    check_role(state("mixed"), params("generation_only"))  # type: ignore[arg-type]
    with pytest.raises(NotImplementedFeature):
        check_role(state("mixed", has_kv=False), params("context_only"))  # type: ignore[arg-type]


def test_trtllm_params_are_read_with_their_newer_fields() -> None:
    p = DisaggregatedParams.model_validate(
        {"request_type": "GENERATION_ONLY", "first_gen_tokens": [7], "ctx_request_id": 3, "schedule_style": 1,
         "encoded_opaque_state": "eA==", "conversation_id": "c"}
    )
    assert p.request_type == "generation_only" and p.first_gen_tokens == [7]
    with pytest.raises(ValueError):
        DisaggregatedParams.model_validate({"request_type": "prefill_please"})


def test_the_opaque_state_round_trips_and_refuses_garbage() -> None:
    state_ = OpaqueState("tcp", "10.0.0.5", 9000, 12345, 100, 7, "f" * 32, {"session": "h:1"})
    assert OpaqueState.decode(state_.encode()) == state_
    for bad in ("not base64!", "eyJ2IjoyfQ==", "bnVsbA=="):  # garbage, version 2, JSON null
        with pytest.raises(ValueError, match="encoded_opaque_state"):
            OpaqueState.decode(bad)


async def test_pins_are_released_once_pulled_or_expired_and_not_while_leased() -> None:
    released: list[int] = []

    async def release(pin_id: int) -> None:
        released.append(pin_id)

    exports = KVExports(ttl_s=10.0, release=release)
    for pin_id in (1, 2, 3):
        exports.add(KVPin(pin_id, [pin_id], 16))
    exports.lease(1)
    with pytest.raises(PinNotFound, match="being pulled"):
        exports.lease(1)
    exports.lease(2)
    await exports.finish(2, pulled=False)  # a broken pull: another decode backend may pull it
    assert await exports.expire(now=float("inf")) == 2 and sorted(released) == [2, 3]  # the leased pin stays
    await exports.finish(1, pulled=True)
    assert sorted(released) == [1, 2, 3] and len(exports) == 0 and exports.num_expired == 2
    with pytest.raises(PinNotFound, match="expired"):
        exports.lease(3)


def test_a_disaggregated_role_on_cuda_is_refused_at_start() -> None:
    # KV transfer reads the cache in host memory: the built-in engine offers it on the CPU only, so a
    # prefill or decode backend on CUDA is refused before its model loads, naming the way out.
    cuda = EngineConfig(device="cuda", dtype="bfloat16")
    for role in ("prefill", "decode"):
        with pytest.raises(ValueError, match="role = mixed"):
            BackendSettings(role=role, engine=cuda)
    assert BackendSettings(role="mixed", engine=cuda).role == "mixed"
    assert BackendSettings(role="decode").engine.device == "cpu"
    assert BackendSettings(role="decode", engine_kind="trtllm", engine=cuda).role == "decode"  # trtllm-serve moves its own KV
