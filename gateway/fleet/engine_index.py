"""vLLM's and SGLang's KV events -> the gateway's prefix index, one backend at a time.

The engines name blocks by their own hashes (vLLM: SHA-256 over CBOR of parent, tokens and extra
keys, seeded by a NONE_HASH; SGLang: its own 64-bit chain). The index is keyed by ours
(`contracts.prefix_hash`: a tenant-salted BLAKE2b chain). Like llm-d's precise prefix-cache
scorer, `EngineBlockMap` does not recompute the engine's hashes: it re-hashes the *tokens* each
`BlockStored` event carries into our chain and keeps a map from the engine's hash to where our
chain stands after that block (its salt, our last full block's hash, the tokens past it). Then

- a child block finds its parent by the engine hash the event names, and continues our chain;
- `BlockRemoved` finds the hashes of ours that a removed block completed, and removes them;
- `AllBlocksCleared` (and a lost or restarted event stream) removes every hash this map put in
  the index for the backend and forgets the map.

Why re-hash rather than recompute the engine's hashes: it holds whatever hash algorithm, seed
(`PYTHONHASHSEED`, which vLLM's NONE_HASH depends on when set) or integer/bytes form the engine
uses, and whatever block size (SGLang's default page is one token; ours is 16): engine blocks are
cut into our blocks through the carried tail. It needs the engine to say which salt a chain
started with, and both do: vLLM puts the request's `cache_salt` in the first block's
`extra_keys`, SGLang sends it as metadata. The gateway sends each tenant's salt as `cache_salt`,
so the first block's salt names the tenant, and a chain is only ever continued under the salt it
started with.

Tenant isolation follows: a block is entered under our hash of (its chain's salt, its tokens), a
request of tenant B looks up hashes salted with B's salt, so it can only match blocks whose chain
started with B's salt. Whatever cannot be placed for certain is skipped and counted, never
guessed: a first block without a salt (a request that did not come through the gateway), a
parent this map does not know (events from before the gateway subscribed), a parent known under
two salts with no salt in the event (SGLang without salt in its hashes), blocks of a LoRA adapter
or with image or embedding keys (their identity is more than tokens), and blocks not in the GPU
cache or not in KV cache group 0.

The map is bounded (`max_blocks` engine blocks, the least recently stored forgotten first); what a
forgotten block put in the index then expires with the index's own TTL.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from backends.client.engine_events import AllBlocksCleared, BlocksRemoved, BlocksStored, EngineEvent, EngineHash
from contracts.prefix_hash import block_hash, salt_root
from gateway.store.routing import RoutingState

DEFAULT_MAX_BLOCKS = 200_000


@dataclass(frozen=True, slots=True)
class _Link:
    """Our chain after one engine block."""

    salt: str
    parent: int  # our hash of the last full block so far (the salt's root before the first)
    tail: tuple[int, ...]  # tokens after it: fewer than a block
    hashes: tuple[int, ...]  # our blocks this engine block completed

    def then(self, tokens: tuple[int, ...], block_size: int) -> _Link:
        tail, parent, done = self.tail + tokens, self.parent, []
        while len(tail) >= block_size:
            parent = block_hash(parent, tail[:block_size])
            done.append(parent)
            tail = tail[block_size:]
        return _Link(self.salt, parent, tail, tuple(done))


@dataclass(slots=True)
class SkipCounts:
    unsalted: int = 0  # a chain's first block with no salt: not a gateway request
    orphans: int = 0  # a parent this map does not know (or knows under several salts)
    foreign: int = 0  # LoRA, image or embedding keys, another medium or cache group, bad token count


class EngineBlockMap:
    """One backend's engine hashes -> our chain; `apply` each batch's events in order."""

    def __init__(self, routing: RoutingState, backend_id: str, block_size: int, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.routing = routing
        self.backend_id = backend_id
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.skipped = SkipCounts()
        self._links: OrderedDict[EngineHash, dict[str, _Link]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._links)

    async def apply(self, events: tuple[EngineEvent, ...]) -> None:
        for event in events:
            if isinstance(event, BlocksStored):
                hashes = self._stored(event)
                if hashes:
                    await self.routing.record_prefix(self.backend_id, hashes)
            elif isinstance(event, BlocksRemoved):
                if _is_ours(event.medium, event.group_idx):
                    hashes = [h for engine_hash in event.block_hashes for h in self._forget(engine_hash)]
                    if hashes:
                        await self.routing.remove_prefix(self.backend_id, hashes)
            elif isinstance(event, AllBlocksCleared):
                await self.clear()

    async def clear(self) -> None:
        """Remove every hash this map entered for the backend, and forget the map."""
        hashes = [h for links in self._links.values() for link in links.values() for h in link.hashes]
        self._links.clear()
        if hashes:
            await self.routing.remove_prefix(self.backend_id, hashes)

    def _stored(self, event: BlocksStored) -> list[int]:
        """Our hashes for the blocks of `event` that can be placed for certain (in order, stopping
        at the first that cannot)."""
        size, num = event.block_size, len(event.block_hashes)
        if not _is_ours(event.medium, event.group_idx) or len(event.token_ids) != size * num:
            self.skipped.foreign += num
            return []
        link = self._first_link(event)
        if link is None:
            return []
        found: list[int] = []
        for index, engine_hash in enumerate(event.block_hashes):
            if event.has_foreign_keys(index) and not (index == 0 and event.parent_hash is None):
                self.skipped.foreign += num - index
                break
            link = link.then(event.token_ids[index * size : (index + 1) * size], self.block_size)
            self._remember(engine_hash, link)
            found += link.hashes
        return found

    def _first_link(self, event: BlocksStored) -> _Link | None:
        """Where our chain stands before the event's first block."""
        num = len(event.block_hashes)
        salt = event.salt_of_block(0)
        if event.parent_hash is None:
            if salt is None or event.has_foreign_keys(0):
                self.skipped.unsalted += num
                return None
            return _Link(salt, salt_root(salt), (), ())
        parents = self._links.get(event.parent_hash)
        if parents is not None and salt is not None:
            parent = parents.get(salt)
        elif parents is not None and len(parents) == 1:
            parent = next(iter(parents.values()))
        else:
            parent = None
        if parent is None:
            self.skipped.orphans += num
            return None
        return _Link(parent.salt, parent.parent, parent.tail, ())

    def _remember(self, engine_hash: EngineHash, link: _Link) -> None:
        links = self._links.get(engine_hash)
        if links is None:
            self._links[engine_hash] = {link.salt: link}
            while len(self._links) > self.max_blocks:
                self._links.popitem(last=False)
        else:
            links[link.salt] = link
            self._links.move_to_end(engine_hash)

    def _forget(self, engine_hash: EngineHash) -> list[int]:
        links = self._links.pop(engine_hash, None)
        return [h for link in (links or {}).values() for h in link.hashes]


def _is_ours(medium: str | None, group_idx: int | None) -> bool:
    """Blocks in the engine's GPU cache (the only tier the index counts) and its first KV cache group."""
    return (medium is None or medium.upper() == "GPU") and (group_idx is None or group_idx == 0)
