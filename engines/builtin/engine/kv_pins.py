"""KV blocks kept alive after a context step, until a decode backend has pulled them.

A context-only request (`GenerationRequest.pin_kv_on_finish`) that stops at its token budget
keeps its block references instead of dropping them: the blocks can be neither reused nor
evicted, so another backend may read them while this engine goes on serving others. The pin is
released when the pull completes, or when its owner (the backend's export registry) gives up on
it after a TTL. Full prompt blocks stay in the prefix cache either way.

Owned by the engine thread, like the block manager it holds references in.
"""

from __future__ import annotations

import secrets

from engines.base import KVPin
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.sequence import Sequence


class KVPins:
    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager
        self.pins: dict[int, KVPin] = {}

    @property
    def num_pinned_blocks(self) -> int:
        return sum(len(pin.block_ids) for pin in self.pins.values())

    def pin(self, seq: Sequence) -> KVPin:
        """Take over `seq`'s block references (its table is emptied, so finishing frees nothing).

        The pin covers the positions whose KV is computed: the prompt, not the token just sampled.
        """
        num_tokens = seq.num_computed_tokens
        block_ids = seq.block_table[: self.block_manager.num_blocks_for(num_tokens)]
        self.block_manager.release(seq.block_table[len(block_ids) :])
        seq.block_table = []
        pin_id = secrets.randbits(63)  # names the pin on the wire: not guessable
        while pin_id in self.pins:
            pin_id = secrets.randbits(63)
        pin = KVPin(pin_id, block_ids, num_tokens)
        self.pins[pin_id] = pin
        return pin

    def release(self, pin_id: int) -> bool:
        """Give the pin's blocks back; False if it is unknown (already released)."""
        pin = self.pins.pop(pin_id, None)
        if pin is None:
            return False
        self.block_manager.release(pin.block_ids)
        return True

    def release_all(self) -> None:
        for pin_id in list(self.pins):
            self.release(pin_id)
