"""Turning a batch of logits into next tokens: small pure functions, then one batched `Sampler`.

Shapes: B = rows being sampled, V = vocabulary. Penalties follow Hugging Face
(repetition: over prompt + output) and OpenAI (frequency/presence: over generated tokens only).
A request with a seed owns a `torch.Generator`, so its draws do not depend on who else is in
the batch.
"""

from __future__ import annotations

import torch

from engines.builtin.engine.sequence import Sequence
from engines.builtin.grammar.mask import allocate_bitmask, apply_bitmask


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    # logits: [B, V], seen: [B, V] bool (token in prompt or output), penalty: [B, 1]
    # HF semantics: a seen token's logit l becomes l / p if l > 0 else l * p.
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_frequency_presence(
    logits: torch.Tensor, counts: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
) -> torch.Tensor:
    # counts: [B, V] occurrences in the generated tokens; frequency, presence: [B, 1]
    # OpenAI semantics: l -= frequency * count + presence * (count > 0)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    # top_k: [B] long in [1, V]; keep each row's k largest logits (ties at the k-th kept too)
    max_k = int(top_k.max())
    top_values = logits.topk(max_k, dim=-1).values  # [B, max_k], descending
    kth = top_values.gather(-1, (top_k - 1).unsqueeze(-1))  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # top_p: [B, 1]; keep the smallest set of most likely tokens whose probability reaches p
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of strictly better tokens
    drop_sorted = mass_before >= top_p  # the first token always has mass_before == 0: kept
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def greedy_ids(logits: torch.Tensor) -> list[int]:
    # logits: [B, V] -> each row's argmax, the first index on ties (NaN counts as the largest, as in torch).
    # On the CPU numpy's vectorised argmax: SmolLM2's 49,152 logits take ~5 us against torch's ~43 (a decode
    # step is ~5.5 ms at batch 1); the same index in every case, ties and NaN included.
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(axis=-1).tolist()  # type: ignore[no-any-return]
    return logits.argmax(dim=-1).tolist()


def sample_from_probs(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    # probs: [B, V], noise: [B, V] ~ Exp(1). argmax(p / q) is a draw from p (exponential race).
    return (probs / noise).argmax(dim=-1)


def exponential_noise(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    return torch.empty(shape, device=device).exponential_(generator=generator)


class Sampler:
    """Samples one token per row of `logits` for the matching sequence."""

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}  # for requests without a seed

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        # logits: [B, V] float32
        logits = self.prepare_guided(logits, seqs)
        if all(s.sampling.is_greedy and not has_penalty(s) for s in seqs):
            return greedy_ids(logits)  # fast path
        logits = self.prepare_penalised(logits, seqs)
        next_ids = logits.argmax(dim=-1)  # [B]: right for greedy rows, overwritten for the rest
        rows = [i for i, s in enumerate(seqs) if not s.sampling.is_greedy]
        if rows:
            sampled = self.sample_rows(logits[rows], [seqs[i] for i in rows])
            next_ids[rows] = sampled
        return next_ids.tolist()

    def prepare_guided(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Rows of guided sequences with the tokens their grammar forbids at -inf; other rows as they were."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return logits
        bitmask = allocate_bitmask(len(rows), logits.shape[-1])  # [R, ceil(V / 32)] int32, on the CPU
        for j, i in enumerate(rows):
            seqs[i].matcher.fill_bitmask(bitmask, j)
        logits = logits.clone()
        logits[rows] = apply_bitmask(logits[rows], bitmask)
        return logits

    def prepare_penalised(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows = [i for i, s in enumerate(seqs) if has_penalty(s)]
        if not rows:
            return logits
        logits = logits.clone()
        device, vocab = logits.device, logits.shape[-1]
        sub = [seqs[i] for i in rows]
        seen = torch.zeros(len(sub), vocab, dtype=torch.bool, device=device)
        counts = torch.zeros(len(sub), vocab, dtype=logits.dtype, device=device)
        for j, s in enumerate(sub):
            seen[j, torch.tensor(s.token_ids, device=device)] = True
            generated = torch.tensor(s.generated_token_ids, dtype=torch.long, device=device)
            counts[j].index_add_(0, generated, torch.ones_like(generated, dtype=logits.dtype))
        def column(values: list[float]) -> torch.Tensor:  # -> [len(sub), 1]
            return torch.tensor(values, dtype=logits.dtype, device=device).unsqueeze(-1)

        part = logits[rows]
        part = apply_repetition_penalty(part, seen, column([s.sampling.repetition_penalty for s in sub]))
        part = apply_frequency_presence(
            part,
            counts,
            column([s.sampling.frequency_penalty for s in sub]),
            column([s.sampling.presence_penalty for s in sub]),
        )
        logits[rows] = part
        return logits

    def sample_rows(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        # logits: [B, V] of non-greedy rows
        device, vocab = logits.device, logits.shape[-1]
        probs = self.probs(logits, seqs)
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.sampling.seed is None]
        if unseeded:
            noise[unseeded] = exponential_noise((len(unseeded), vocab), device, self._shared_generator(device))
        for i, s in enumerate(seqs):
            if s.sampling.seed is not None:
                noise[i] = exponential_noise((vocab,), device, self._request_generator(s, s.sampling.seed, device))
        return sample_from_probs(probs, noise)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        # logits: [B, V] of non-greedy rows, penalties applied -> the distribution each row samples   [B, V]
        device, vocab = logits.device, logits.shape[-1]
        temperature = torch.tensor([s.sampling.temperature for s in seqs], device=device).unsqueeze(-1)
        logits = logits / temperature
        if any(s.sampling.top_k is not None for s in seqs):
            top_k = torch.tensor([min(s.sampling.top_k or vocab, vocab) for s in seqs], device=device)
            logits = apply_top_k(logits, top_k)
        if any(s.sampling.top_p < 1.0 for s in seqs):
            top_p = torch.tensor([s.sampling.top_p for s in seqs], device=device).unsqueeze(-1)
            logits = apply_top_p(logits, top_p)
        return logits.softmax(dim=-1)

    def generator_for(self, seq: Sequence, device: torch.device) -> torch.Generator:
        """The RNG `seq` draws from: its own with a seed, else the sampler's shared one."""
        if seq.sampling.seed is not None:
            return self._request_generator(seq, seq.sampling.seed, device)
        return self._shared_generator(device)

    def _request_generator(self, seq: Sequence, seed: int, device: torch.device) -> torch.Generator:
        if seq.generator is None:
            seq.generator = torch.Generator(device=device).manual_seed(seed)
        return seq.generator

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            generator = torch.Generator(device=device)
            if self.seed is None:
                generator.seed()
            else:
                generator.manual_seed(self.seed)
            self._generators[device] = generator
        return self._generators[device]


def has_penalty(seq: Sequence) -> bool:
    p = seq.sampling
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
