"""vLLM's and SGLang's KV events re-hashed into the gateway's tenant-salted prefix index."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.client.engine_events import AllBlocksCleared, BlocksRemoved, BlocksStored, decode_batch
from gateway.fleet.engine_index import EngineBlockMap
from gateway.pipeline.tenant_salt import derive_cache_salt
from gateway.store import Store
from policies.prefix import block_hashes
from tests.gateway.store.calls import match_prefix

BLOCK = 4  # the gateway's block size in these tests
SECRET = b"test-secret-0123456789abcdef0123"
SALT_A, SALT_B = derive_cache_salt(SECRET, "tenant-a"), derive_cache_salt(SECRET, "tenant-b")


def engine_hash(*parts: object) -> bytes:
    """Stands for the engine's own hash (SHA-256 of anything): only ever compared."""
    return hashlib.sha256(repr(parts).encode()).digest()


def vllm_stored(tokens: list[int], size: int, salt: str | None, parent: bytes | None = None) -> BlocksStored:
    """What vLLM publishes for the full blocks of `tokens` (salt in the first block's extra keys)."""
    num = len(tokens) // size
    hashes, previous = [], parent
    for i in range(num):
        previous = engine_hash(previous, tokens[i * size : (i + 1) * size], salt if i == 0 and parent is None else None)
        hashes.append(previous)
    extra = tuple(((salt,) if i == 0 and parent is None and salt else None) for i in range(num))
    return BlocksStored(tuple(hashes), parent, tuple(tokens[: num * size]), size, extra, medium="GPU", group_idx=0)


async def matched(store: Store, tokens: list[int], salt: str) -> dict[str, int]:
    return await match_prefix(store, block_hashes(tokens, BLOCK, salt))


async def test_stored_blocks_match_the_tenants_own_requests_only(store: Store) -> None:
    prompt = list(range(100, 124))  # 6 of our blocks, 3 engine blocks of 8
    index = EngineBlockMap(store.routing, "vllm-a", BLOCK)
    await index.apply((vllm_stored(prompt, 8, SALT_A),))
    assert await matched(store, prompt, SALT_A) == {"vllm-a": 6}
    assert await matched(store, prompt, SALT_B) == {}


async def test_children_continue_their_parents_chain_and_removals_take_it_back(store: Store) -> None:
    prompt = list(range(100, 132))
    first = vllm_stored(prompt[:16], 8, SALT_A)
    child = vllm_stored(prompt[16:], 8, None, parent=first.block_hashes[-1])
    index = EngineBlockMap(store.routing, "vllm-a", BLOCK)
    await index.apply((first, child))
    assert await matched(store, prompt, SALT_A) == {"vllm-a": 8}
    await index.apply((BlocksRemoved((child.block_hashes[-1],), "GPU", 0),))
    assert await matched(store, prompt, SALT_A) == {"vllm-a": 6}
    await index.apply((AllBlocksCleared(),))
    assert await matched(store, prompt, SALT_A) == {} and len(index) == 0


async def test_engine_blocks_smaller_than_ours_carry_their_tokens_over(store: Store) -> None:
    """SGLang's default page is one token: four of its blocks make one of ours."""
    prompt = list(range(100, 110))
    hashes = tuple(range(1, 11))
    salted = BlocksStored(hashes[:3], None, tuple(prompt[:3]), 1, cache_salt=SALT_A, medium="GPU")
    rest = BlocksStored(hashes[3:], hashes[2], tuple(prompt[3:]), 1, cache_salt=SALT_A, medium="GPU")
    index = EngineBlockMap(store.routing, "sglang-a", BLOCK)
    await index.apply((salted, rest))
    assert await matched(store, prompt, SALT_A) == {"sglang-a": 2}  # 10 tokens: two full blocks of 4
    await index.apply((BlocksRemoved((hashes[7],)),))  # the engine block that completed our second block
    assert await matched(store, prompt, SALT_A) == {"sglang-a": 1}


async def test_what_cannot_be_placed_is_skipped(store: Store) -> None:
    prompt = list(range(100, 116))
    index = EngineBlockMap(store.routing, "vllm-a", BLOCK)
    unsalted = vllm_stored(prompt, 8, None)  # not a gateway request
    orphan = vllm_stored(prompt, 8, None, parent=engine_hash("never seen"))
    offloaded = BlocksStored(vllm_stored(prompt, 8, SALT_A).block_hashes, None, tuple(prompt), 8,
                             ((SALT_A,), None), medium="CPU")
    lora = BlocksStored((engine_hash(1),), None, tuple(prompt[:8]), 8, ((SALT_A,),), has_lora=True)
    await index.apply((unsalted, orphan, offloaded, lora))
    assert await matched(store, prompt, SALT_A) == {}
    assert (index.skipped.unsalted, index.skipped.orphans, index.skipped.foreign) == (3, 2, 2)


async def test_a_parent_known_under_two_salts_is_not_guessed(store: Store) -> None:
    """SGLang without salted hashes: two tenants' same first block has one engine hash."""
    prompt = list(range(100, 108))
    a = BlocksStored((1,), None, tuple(prompt[:4]), 4, cache_salt=SALT_A)
    b = BlocksStored((1,), None, tuple(prompt[:4]), 4, cache_salt=SALT_B)
    unnamed_child = BlocksStored((2,), 1, tuple(prompt[4:]), 4)
    named_child = BlocksStored((3,), 1, tuple(prompt[4:]), 4, cache_salt=SALT_B)
    index = EngineBlockMap(store.routing, "sglang-a", BLOCK)
    await index.apply((a, b, unnamed_child, named_child))
    assert await matched(store, prompt, SALT_A) == {"sglang-a": 1}
    assert await matched(store, prompt, SALT_B) == {"sglang-a": 2}
    assert index.skipped.orphans == 1


async def test_the_map_is_bounded(store: Store) -> None:
    index = EngineBlockMap(store.routing, "vllm-a", BLOCK, max_blocks=2)
    await index.apply((vllm_stored(list(range(100, 124)), 8, SALT_A),))
    assert len(index) == 2


_examples = itertools.count()
tenants = st.sampled_from(["tenant-a", "tenant-b", "tenant-c"])
prompts = st.lists(st.integers(0, 40), min_size=4, max_size=40)
engine_block_sizes = st.sampled_from([1, 2, 4, 8, 16])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(tenants, prompts), min_size=1, max_size=6), engine_block_sizes, tenants, prompts)
async def test_no_request_scores_a_backend_on_another_tenants_blocks(
    store: Store, cached: list[tuple[str, list[int]]], engine_size: int, asking: str, prompt: list[int]
) -> None:
    """Whatever the engine cached for other tenants (any prompts, any engine block size), a request
    matches exactly as many blocks as the engine cached for its own tenant's prompts."""
    backend = f"vllm-{next(_examples)}"  # the store outlives one example: each gets its own backend
    index = EngineBlockMap(store.routing, backend, BLOCK)
    for tenant, tokens in cached:
        await index.apply((vllm_stored(tokens, engine_size, derive_cache_salt(SECRET, tenant)),))
    own = [tokens[: len(tokens) // engine_size * engine_size] for tenant, tokens in cached if tenant == asking]
    expected = max((_common_full_blocks(prompt, tokens) for tokens in own), default=0)
    found = (await matched(store, prompt, derive_cache_salt(SECRET, asking))).get(backend, 0)
    assert found == expected


def _common_full_blocks(prompt: list[int], cached: list[int]) -> int:
    num = 0
    while (num + 1) * BLOCK <= min(len(prompt), len(cached)) and prompt[: (num + 1) * BLOCK] == cached[: (num + 1) * BLOCK]:
        num += 1
    return num


async def test_a_real_vllms_events_index_each_tenants_prompt_under_its_own_salt(store: Store) -> None:
    """vLLM 0.32.0's own messages (tests/backends/fixtures/kv_events): engine blocks of 32 tokens,
    ours of 4; the unsalted request's blocks stay out."""
    recorded = Path(__file__).parents[2] / "backends" / "fixtures" / "kv_events" / "vllm_0_32_recorded.msgpack"
    index = EngineBlockMap(store.routing, "vllm-a", BLOCK)
    for _, _, payload in msgpack.unpackb(recorded.read_bytes())["live"]:
        await index.apply(decode_batch(payload).events)
    prompt = list(range(1000, 1070))
    assert await matched(store, prompt, "salt-tenant-a") == {"vllm-a": 16}  # 64 cached tokens
    assert await matched(store, prompt, "salt-tenant-b") == {"vllm-a": 16}
    assert await matched(store, prompt, "salt-tenant-c") == {}
    assert index.skipped.unsalted == 2
