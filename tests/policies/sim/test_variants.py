from __future__ import annotations

from collections import Counter

from policies.sim.trace import TraceRequest, prepare
from policies.sim.variants import VARIANTS, heavy_sessions, one_session, shared_block, tenants


def trace(num_conversations: int = 60, num_turns: int = 3) -> list[TraceRequest]:
    """Conversation c, turn t: blocks [c*100 .. c*100 + 2t + 1], 700 + 1024t tokens."""
    return [
        TraceRequest(t * 10_000 + c * 10, 700 + 1024 * t, 5, tuple(range(c * 100, c * 100 + 2 * t + 2)))
        for c in range(num_conversations)
        for t in range(num_turns)
    ]


def test_shared_block_prefixes_every_request_with_one_new_block() -> None:
    out = shared_block(trace())
    assert len({r.hash_ids[0] for r in out}) == 1 and out[0].hash_ids[0] > max(h for r in trace() for h in r.hash_ids)
    assert all(r.input_length == o.input_length + 512 for r, o in zip(out, sorted(trace(), key=lambda r: r.timestamp_ms)))
    # conversations are still told apart
    assert len({r.conversation for r in prepare(out)}) == 60


def test_tenants_share_their_own_system_prompt() -> None:
    out = tenants(trace(), seed=3)
    by_tenant: dict[str, set[int]] = {}
    for r in out:
        by_tenant.setdefault(r.tenant, set()).add(r.hash_ids[0])
    assert 2 <= len(by_tenant) <= 4 and all(len(firsts) == 1 for firsts in by_tenant.values())
    assert len({next(iter(firsts)) for firsts in by_tenant.values()}) == len(by_tenant)


def test_heavy_sessions_group_whole_conversations_with_a_heavy_tail() -> None:
    out = prepare(heavy_sessions(trace(num_conversations=300), seed=1))
    sessions_of = {}
    for r in out:
        assert sessions_of.setdefault(r.conversation, r.session_id) == r.session_id  # a conversation keeps its id
    sizes = Counter(sessions_of.values())
    assert max(sizes.values()) >= 10 * (300 / len(sizes))  # the biggest session dwarfs the mean


def test_one_session_sends_one_id_for_everything() -> None:
    assert {r.session_id for r in prepare(one_session(trace()))} == {"everything"}


def test_every_variant_is_reproducible_from_its_seed() -> None:
    for name, make in VARIANTS.items():
        assert make(trace(), 7) == make(trace(), 7), name
    assert tenants(trace(), 1) != tenants(trace(), 2) or heavy_sessions(trace(), 1) != heavy_sessions(trace(), 2)
