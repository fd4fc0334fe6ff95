"""The regional KV pool's rules that need no process: keys, values and the settings that refuse it."""

from __future__ import annotations

import pytest
import torch

from backends.kv_transfer.region_pool import BlockCodec
from backends.settings import BackendSettings
from contracts.prefix_hash import chain_hashes
from engines.builtin.config import EngineConfig
from engines.builtin.engine.host_tier import TierBlock

SHAPE = (2, 4, 2, 1, 3)  # layers, block size, k/v, kv heads, head size


def test_a_block_round_trips_and_a_foreign_value_is_refused() -> None:
    codec = BlockCodec("f" * 32, SHAPE, torch.float32)
    data = torch.arange(48, dtype=torch.float32).view(SHAPE)
    block = TierBlock(-5, 17, (1, 2, 3, 4), data)
    back = codec.decode(-5, codec.encode(block))
    assert back is not None and back.token_ids == (1, 2, 3, 4) and back.parent_hash == 17
    assert torch.equal(back.data, data)
    half = BlockCodec("f" * 32, SHAPE, torch.float16)
    assert codec.decode(-5, half.encode(block)) is None  # another storage dtype: the size is off
    assert codec.decode(-5, b"ERKV") is None and codec.decode(-5, b"x" * 400) is None


def test_keys_carry_the_layout_the_dtype_and_the_tenant_salted_hash() -> None:
    tokens = list(range(8))
    a, b = chain_hashes(tokens, 4, "tenant-a"), chain_hashes(tokens, 4, "tenant-b")
    codec = BlockCodec("0123abcd" * 4, SHAPE, torch.float32)
    assert codec.key(a[0]) != codec.key(b[0])  # the same tokens, another tenant: another key
    assert codec.key(a[0]).startswith("edgerun/0123abcd")
    assert codec.key(a[0]) != BlockCodec("0123abcd" * 4, SHAPE, torch.float16).key(a[0])
    assert codec.key(a[0]) != BlockCodec("9" * 32, SHAPE, torch.float32).key(a[0])  # another model or layout


def test_the_pool_is_refused_without_a_host_tier_or_a_trusted_network() -> None:
    with pytest.raises(ValueError, match="host_tier_blocks"):
        BackendSettings(kv_region_pool_master="127.0.0.1:50051", kv_mooncake_trusted_network=True)
    with pytest.raises(ValueError, match="authenticates no one"):
        BackendSettings(kv_region_pool_master="127.0.0.1:50051", engine=EngineConfig(host_tier_blocks=64))
    BackendSettings(kv_region_pool_master="127.0.0.1:50051", kv_mooncake_trusted_network=True,
                    engine=EngineConfig(host_tier_blocks=64))
