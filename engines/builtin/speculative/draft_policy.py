"""How many tokens to draft for a sequence's next verify step: expected gain over measured cost.

Each sequence keeps an acceptance estimate `alpha`, the chance that a draft is accepted given that
the ones before it were: decayed counts of accepted drafts over drafts that met the verifier (the
first rejected one included, the ones after it not), starting from a weak prior. With acceptance
alpha, a verify step of k drafts emits on average

    E(k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)   tokens,

and costs C(k) = 1 + (verify_cost + draft_cost) * k plain decode steps, where `verify_cost` is
what one more token in a batch-1 row adds to the target's step and `draft_cost` what the proposer
spends per drafted token, both relative to a plain decode step and measured as the engine runs
(`StepCosts`). The policy drafts the k in [0, max_drafts] with the best E(k) / C(k); k = 0 (a
plain decode, ratio 1) wins whenever drafting would not pay, so speculation never knowingly slows
a sequence down. A copy task (alpha near 1) is given long drafts, open chat (alpha small) none.

A sequence that drafts nothing still needs evidence to start again: the engine then asks the
proposer for a single "shadow" draft that is not verified, and checks it against the token the
target commits next (for a sampled request that match has the acceptance probability, p(draft), as
its expectation). Shadow drafts are free for n-gram lookup; for a proposer that costs time they
are taken only every `shadow_every` steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Acceptance:
    """Decayed counts of one sequence's drafts: `accepted` of `trials` met the verifier."""

    accepted: float
    trials: float

    @property
    def alpha(self) -> float:
        return self.accepted / self.trials

    def update(self, num_accepted: int, num_trials: int, decay: float) -> None:
        self.accepted = decay * self.accepted + num_accepted
        self.trials = decay * self.trials + num_trials


def expected_tokens(alpha: float, k: int) -> float:
    # 1 + alpha + ... + alpha^k: the accepted drafts of a k-draft verify step plus the target's own token
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_num_drafts(alpha: float, cost_per_draft: float, max_drafts: int) -> int:
    """argmax over k in [0, max_drafts] of E(k) / (1 + cost_per_draft * k); 0 when nothing beats a decode."""
    best_k, best = 0, 1.0
    for k in range(1, max_drafts + 1):
        gain = expected_tokens(alpha, k) / (1.0 + cost_per_draft * k)
        if gain > best * 1.01:  # a 1% edge at least: a tie is not worth the verify row's risk
            best_k, best = k, gain
    return best_k


class StepCosts:
    """Running estimates of a batch-1 step's cost: a plain decode, each extra verify token, each draft.

    `observe_step(num_tokens, seconds)` takes steps whose only row was one sequence's decode or
    verify row of `num_tokens` tokens; the per-token cost is the slope of a least-squares line through
    the decayed mean step time at each row length seen. Until two lengths are seen, `prior` stands.
    """

    def __init__(self, prior_verify_cost: float, decay: float = 0.9) -> None:
        self.prior = prior_verify_cost
        self.decay = decay
        self.mean_seconds: dict[int, float] = {}  # row length -> decayed mean step time
        self.draft_seconds: float | None = None  # decayed mean proposer time per drafted token

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        old = self.mean_seconds.get(num_tokens)
        self.mean_seconds[num_tokens] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def observe_drafts(self, num_drafts: int, seconds: float) -> None:
        if num_drafts > 0:
            per = seconds / num_drafts
            old = self.draft_seconds
            self.draft_seconds = per if old is None else self.decay * old + (1 - self.decay) * per

    @property
    def decode_seconds(self) -> float | None:
        if 1 in self.mean_seconds:
            return self.mean_seconds[1]
        fit = self.fit()
        return None if fit is None else fit[0] + fit[1]

    def fit(self) -> tuple[float, float] | None:
        # -> (intercept, slope) of seconds over row length, or None with fewer than two lengths
        if len(self.mean_seconds) < 2:
            return None
        xs, ys = list(self.mean_seconds), list(self.mean_seconds.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
        return my - slope * mx, slope

    @property
    def verify_cost(self) -> float:
        """One more token in a verify row, as a fraction of a plain decode step (clamped to [0.01, 2])."""
        fit, decode = self.fit(), self.decode_seconds
        if fit is None or decode is None or decode <= 0:
            return self.prior
        return min(2.0, max(0.01, fit[1] / decode))

    @property
    def draft_cost(self) -> float:
        """The proposer's time per drafted token, as a fraction of a plain decode step."""
        decode = self.decode_seconds
        if self.draft_seconds is None or decode is None or decode <= 0:
            return 0.0
        return min(2.0, self.draft_seconds / decode)


@dataclass(slots=True)
class DraftPolicy:
    """Per-sequence draft lengths from acceptance and measured cost (see the module docstring)."""

    max_drafts: int
    costs: StepCosts
    prior_alpha: float = 0.5
    prior_weight: float = 2.0  # the prior counts as this many drafts
    decay: float = 0.8  # per verify step: recent acceptance counts most
    shadow_every: int = 8  # shadow drafts of a costly proposer: one per this many steps
    sequences: dict[str, Acceptance] = field(default_factory=dict)
    steps_since_shadow: dict[str, int] = field(default_factory=dict)

    def acceptance(self, seq_id: str) -> Acceptance:
        if seq_id not in self.sequences:
            self.sequences[seq_id] = Acceptance(self.prior_alpha * self.prior_weight, self.prior_weight)
        return self.sequences[seq_id]

    def num_drafts(self, seq_id: str) -> int:
        cost = self.costs.verify_cost + self.costs.draft_cost
        return best_num_drafts(self.acceptance(seq_id).alpha, cost, self.max_drafts)

    def wants_shadow(self, seq_id: str) -> bool:
        """Whether to take a shadow draft this step for a sequence that drafts nothing."""
        if self.costs.draft_cost < 0.01:
            return True
        steps = self.steps_since_shadow.get(seq_id, 0) + 1
        self.steps_since_shadow[seq_id] = steps % self.shadow_every
        return steps >= self.shadow_every

    def observe(self, seq_id: str, num_drafts: int, num_accepted: int) -> None:
        """A verify step (or a shadow draft) of `num_drafts` drafts, the first `num_accepted` right."""
        if num_drafts > 0:
            trials = num_accepted + (1 if num_accepted < num_drafts else 0)
            self.acceptance(seq_id).update(num_accepted, trials, self.decay)

    def finish(self, seq_id: str) -> None:
        self.sequences.pop(seq_id, None)
        self.steps_since_shadow.pop(seq_id, None)

