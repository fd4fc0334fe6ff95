"""Which LoRA adapters are resident, in which slot of the runner's buffers, least recently used first.

A request naming adapter `name` takes a reference on its slot when it is added and gives it back when it
finishes. An adapter not resident is read from `lora_dir/<name>/` (PEFT files) into a free slot, or into
the slot of the least recently used adapter that no request holds; when every slot is held the request
is refused as an overload (retry later), never made to wait on another tenant's adapter.

`unload(name)` forgets a resident adapter at once (its finetune was deleted): the next request naming it
reads `lora_dir/<name>/` again, and its slot is free as soon as the requests still running under it finish.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path

from contracts.lora_adapter import AdapterError
from engines.builtin.loader.peft import load_adapter
from engines.builtin.runner.lora import LoraSlots
from engines.builtin.runner.model_config import ModelConfig
from engines.errors import AdapterNotFound, EngineOverloaded, InvalidRequest

log = logging.getLogger(__name__)


class ResidentAdapters:
    def __init__(self, slots: LoraSlots, model: ModelConfig, lora_dir: Path | None, max_rank: int) -> None:
        self.slots = slots
        self.model = model
        self.lora_dir = lora_dir
        self.max_rank = max_rank
        self.by_name: OrderedDict[str, int] = OrderedDict()  # resident name -> slot, least recently used first
        self.refs = [0] * slots.num_slots
        self.num_loads = 0
        self.last_load_ms = 0.0

    @property
    def names(self) -> list[str]:
        """Resident adapters, most recently used first."""
        return list(reversed(self.by_name))

    def acquire(self, name: str) -> int:
        """The slot holding adapter `name`, loaded if needed, with one more reference."""
        slot = self.by_name.get(name)
        if slot is None:
            slot = self.load(name)
        self.by_name.move_to_end(name)
        self.refs[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        assert self.refs[slot] > 0, f"adapter slot {slot} released twice"
        self.refs[slot] -= 1

    def unload(self, name: str) -> bool:
        """Drop adapter `name` from the resident ones (False: it was not resident). Requests running under it
        keep their slot until they finish; no new one gets it."""
        return self.by_name.pop(name, None) is not None

    def load(self, name: str) -> int:
        if self.lora_dir is None:
            raise AdapterNotFound(f"adapter {name!r}: this engine serves no LoRA adapters (no lora_dir is set)")
        directory = self.lora_dir / name
        if "/" in name or name in ("", ".", "..") or not directory.is_dir():
            raise AdapterNotFound(f"adapter {name!r} is not in {self.lora_dir}: upload it first")
        slot = self.free_slot()
        started = time.perf_counter()
        try:
            adapter = load_adapter(directory, self.model, name, self.max_rank)
        except (AdapterError, FileNotFoundError) as exc:
            raise InvalidRequest(f"adapter {name!r} cannot be served: {exc}") from exc
        self.slots.install(slot, adapter)
        self.by_name[name] = slot
        self.num_loads += 1
        self.last_load_ms = 1e3 * (time.perf_counter() - started)
        log.info("loaded LoRA adapter %s (rank %d, %s) into slot %d in %.1f ms", name, adapter.rank,
                 ",".join(adapter.config.target_modules), slot, self.last_load_ms)
        return slot

    def free_slot(self) -> int:
        taken = set(self.by_name.values())
        for slot in range(self.slots.num_slots):
            if slot not in taken and self.refs[slot] == 0:  # an unloaded adapter's slot, once its requests end
                return slot
        for name, slot in self.by_name.items():  # least recently used first
            if self.refs[slot] == 0:
                del self.by_name[name]
                return slot
        raise EngineOverloaded(f"all {self.slots.num_slots} adapter slots are in use by running requests: retry later")
