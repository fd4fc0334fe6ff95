"""Conversations derived from a trace's block structure.

A Mooncake-style trace says nothing about who sent a request, only which 512-token blocks its
prompt is made of. The next turn of a conversation repeats the previous prompt (and appends the
answer and a new question), so its blocks *extend* the previous request's blocks: all of them,
except perhaps the last one, which was partial and changed id once it filled up.

Rule, per tenant, in arrival order: request r continues conversation C when the longest leading
run of r's blocks seen before belongs to C alone (no other conversation has produced it) and
covers every block of C's latest request but at most its last. Otherwise r starts a new
conversation. A prefix that several conversations share (a system prompt, a shared first
block) therefore never joins them: it names no single conversation. The first block alone
does not decide either, unlike grouping by the first hash id, which folds a trace whose
requests all begin with one shared block into a single conversation.

Known limit: before a second conversation has used a shared prefix, a new conversation whose
prompt covers the whole of an earlier one-off request's full blocks is taken as its next turn;
there is no way to tell them apart from the blocks alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.prefix import chain_hashes

_SHARED = -1  # owner of a prefix that more than one conversation has produced


def derive_conversations(tenants: Sequence[str], hash_ids: Sequence[Sequence[int]]) -> list[int]:
    """One conversation number per request (requests in arrival order, numbers from 0)."""
    owner: dict[tuple[str, int], int] = {}  # (tenant, chain hash of a prefix) -> conversation
    latest_len: list[int] = []  # conversation -> blocks in its latest request
    conversations = []
    for tenant, ids in zip(tenants, hash_ids, strict=True):
        chain = chain_hashes("conversations", ([h] for h in ids))
        matched, found = 0, _SHARED
        for n in range(len(chain), 0, -1):
            if (tenant, chain[n - 1]) in owner:
                matched, found = n, owner[(tenant, chain[n - 1])]
                break
        if found != _SHARED and latest_len[found] - matched <= 1:
            conversation = found
            latest_len[conversation] = len(chain)
        else:
            conversation = len(latest_len)
            latest_len.append(len(chain))
        for h in chain:
            key = (tenant, h)
            previous = owner.setdefault(key, conversation)
            if previous != conversation:
                owner[key] = _SHARED
        conversations.append(conversation)
    return conversations
