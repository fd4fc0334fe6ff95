from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import PolicyError
from policies.prefix import block_hashes, chain_hashes, tenant_salt

tokens = st.lists(st.integers(0, 49_151), max_size=200)


@given(tokens, st.sampled_from([1, 4, 16]))
def test_same_tenant_and_tokens_give_same_hashes(ids: list[int], block_size: int) -> None:
    assert block_hashes(ids, block_size, "acme") == block_hashes(list(ids), block_size, "acme")


@given(st.lists(st.integers(0, 49_151), min_size=16, max_size=64))
def test_another_tenant_never_shares_a_hash(ids: list[int]) -> None:
    a, b = block_hashes(ids, 16, "acme"), block_hashes(ids, 16, "globex")
    assert a and not set(a) & set(b)


@given(tokens, tokens, tokens)
def test_equal_leading_blocks_give_equal_leading_hashes(common: list[int], x: list[int], y: list[int]) -> None:
    bs = 4
    common = common[: len(common) // bs * bs]
    hx, hy = block_hashes(common + x, bs, "t"), block_hashes(common + y, bs, "t")
    n = len(common) // bs
    assert hx[:n] == hy[:n]
    # after the common part the chains agree exactly as long as the blocks do
    for i in range(n, min(len(hx), len(hy))):
        same_block = (common + x)[i * bs : (i + 1) * bs] == (common + y)[i * bs : (i + 1) * bs]
        if not same_block:
            assert hx[i] != hy[i]
            break
        assert hx[i] == hy[i]


def test_a_block_hash_depends_on_everything_before_it() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, "t")
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, "t")
    assert a[1] != b[1]  # same second block, different first block


def test_only_full_blocks_are_hashed() -> None:
    assert block_hashes(list(range(15)), 16, "t") == []
    assert len(block_hashes(list(range(47)), 16, "t")) == 2
    assert block_hashes(list(range(47)), 16, "t") == block_hashes(list(range(32)), 16, "t")


def test_chain_hashes_of_cut_blocks_matches_block_hashes() -> None:
    ids = list(range(64))
    assert chain_hashes("t", [ids[i : i + 16] for i in range(0, 64, 16)]) == block_hashes(ids, 16, "t")


def test_hashes_are_signed_64_bit() -> None:
    hashes = block_hashes(list(range(16 * 500)), 16, "t") + [tenant_salt(f"t{i}") for i in range(500)]
    assert all(-(2**63) <= h < 2**63 for h in hashes)
    assert any(h < 0 for h in hashes) and any(h > 0 for h in hashes)


@pytest.mark.process
def test_stable_across_processes_and_hash_seeds() -> None:
    code = "from policies.prefix import block_hashes; print(block_hashes(list(range(64)), 16, 'acme'))"
    root = Path(__file__).resolve().parents[2]
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {f"{block_hashes(list(range(64)), 16, 'acme')}\n"}


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1], ["7"], [1.5]])
def test_token_ids_that_are_not_int32_are_refused(bad: list[object]) -> None:
    with pytest.raises(PolicyError, match="32-bit"):
        block_hashes(bad * 4, 4, "t")  # type: ignore[arg-type]


def test_empty_tenant_and_bad_block_size_are_refused() -> None:
    with pytest.raises(PolicyError):
        block_hashes([1, 2], 1, "")
    with pytest.raises(PolicyError):
        block_hashes([1, 2], 0, "t")


def test_fast_enough_for_a_4k_token_prompt() -> None:
    ids = [i * 7919 % 49_152 for i in range(4096)]
    runs = 200
    start = time.perf_counter()
    for _ in range(runs):
        block_hashes(ids, 16, "acme")
    per_prompt_ms = (time.perf_counter() - start) / runs * 1000
    print(f"block_hashes: 4096 tokens / 16-token blocks: {per_prompt_ms:.3f} ms per prompt")
    assert per_prompt_ms < 5  # measured ~0.35 ms on a shared 2-core box
