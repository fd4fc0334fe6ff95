"""How many tokens to draft for a sequence's next verify step: expected gain over measured cost.

Each sequence keeps an acceptance estimate `alpha`, the chance that a draft is accepted given that
the ones before it were: decayed counts of accepted drafts over drafts that met the verifier (the
first rejected one included, the ones after it not), starting from a weak prior. With acceptance
alpha, a verify step of k drafts emits on average

    E(k) = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)   tokens,

and costs C(k) plain decode steps: the measured time of a batch-1 step whose row holds 1 + k tokens
over that of a decode (`StepCosts`, per row length, as the engine runs), plus what the proposer
spends on k drafts. The policy drafts the k in [0, max_drafts] with the best E(k) / C(k); k = 0 (a
plain decode, ratio 1) wins whenever drafting would not pay, so speculation never knowingly slows a
sequence down. A copy task (alpha near 1) is given long drafts, open chat (alpha small) none.

"Knowingly" needs a margin: alpha comes from a handful of recent drafts, and the best of nine
noisy ratios is biased upwards. So the decision uses a lower confidence bound of alpha, `margin`
standard errors below the estimate (the decayed trial count is the sample size), and a draft length
must beat plain decoding by 1% at least. A sequence's first drafts therefore wait for evidence.

A sequence that drafts nothing still needs evidence to start: the engine then asks the proposer
for a single "shadow" draft that is not verified, and checks it against the token the target
commits next (for a sampled request that match has the acceptance probability, p(draft), as its
expectation). Shadow drafts are free for n-gram lookup; for a proposer that costs time they are
taken only every `shadow_every` steps.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Acceptance:
    """Decayed counts of one sequence's drafts: `accepted` of `trials` met the verifier."""

    accepted: float
    trials: float

    @property
    def alpha(self) -> float:
        return self.accepted / self.trials

    def lower_bound(self, margin: float) -> float:
        """alpha, `margin` standard errors lower (a binomial over the decayed trial count), at least 0."""
        alpha = self.alpha
        return max(0.0, alpha - margin * math.sqrt(alpha * (1.0 - alpha) / self.trials))

    def update(self, num_accepted: int, num_trials: int, decay: float) -> None:
        self.accepted = decay * self.accepted + num_accepted
        self.trials = decay * self.trials + num_trials


def expected_tokens(alpha: float, k: int) -> float:
    # 1 + alpha + ... + alpha^k: the accepted drafts of a k-draft verify step plus the target's own token
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_num_drafts(alpha: float, step_cost: Callable[[int], float], max_drafts: int) -> int:
    """argmax over k in [0, max_drafts] of E(k) / step_cost(k) (a decode costs 1); 0 when nothing beats a decode."""
    best_k, best = 0, 1.0
    for k in range(1, max_drafts + 1):
        gain = expected_tokens(alpha, k) / step_cost(k)
        if gain > best * 1.01:  # a 1% edge at least: a tie is not worth the verify row's risk
            best_k, best = k, gain
    return best_k


def _line(medians: dict[int, float]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through (row length, seconds); None under two lengths."""
    if len(medians) < 2:
        return None
    xs, ys = list(medians), list(medians.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    return my - slope * mx, slope


@dataclass(slots=True)
class StepCosts:
    """What a batch-1 step costs per row length, and the proposer per draft, as the engine measures them.

    `observe_step(num_tokens, seconds)` takes steps whose only row was one sequence's decode or verify
    row of `num_tokens` tokens; each length keeps its last `window` times, and its cost is their median
    (a step that a neighbour preempted does not move it). Verify rows do not cost a fixed amount per
    token (the kernels' thread splits and cache use change with the row count), so a row length that has
    `min_samples` times is priced from them alone. Others are read off a least-squares line through the
    lengths seen, never below the dearest shorter length measured; with fewer than two lengths seen,
    each more token costs `prior_verify_cost` decode steps.

    Only verify steps time verify rows, so times that stopped all drafting would never be replaced:
    a verify row length not seen in the last `max_age` steps is forgotten (decodes are timed whenever
    drafting stops, so their times stay). Rows timed during a burst of load are then tried again.
    """

    prior_verify_cost: float
    window: int = 16
    min_samples: int = 3
    decay: float = 0.9
    max_age: int = 256
    samples: dict[int, deque[float]] = field(default_factory=dict, init=False)  # row length -> its latest step times
    # row length -> the number of the step that last had it
    last_seen: dict[int, int] = field(default_factory=dict, init=False)
    num_steps: int = field(default=0, init=False)
    draft_seconds: float | None = field(default=None, init=False)  # decayed mean proposer time per drafted token
    # the medians and their line, read by every decision (up to 1 + max_drafts step costs each): computed
    # once per step observed, not per read
    _medians: dict[int, float] | None = field(default=None, init=False, repr=False)
    _fit: tuple[float, float] | None = field(default=None, init=False, repr=False)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        self._medians = None
        self.num_steps += 1
        self.samples.setdefault(num_tokens, deque(maxlen=self.window)).append(seconds)
        self.last_seen[num_tokens] = self.num_steps
        oldest = self.num_steps - self.max_age
        for n in [n for n, seen in self.last_seen.items() if n > 1 and seen < oldest]:
            del self.samples[n], self.last_seen[n]

    def observe_drafts(self, num_drafts: int, seconds: float) -> None:
        if num_drafts > 0:
            per = seconds / num_drafts
            old = self.draft_seconds
            self.draft_seconds = per if old is None else self.decay * old + (1 - self.decay) * per

    def median_seconds(self) -> dict[int, float]:
        if self._medians is None:
            self._medians = {n: statistics.median(times) for n, times in sorted(self.samples.items())}
            self._fit = _line(self._medians)
        return self._medians

    def fit(self) -> tuple[float, float] | None:
        # -> (intercept, slope) of median seconds over row length, or None with fewer than two lengths
        self.median_seconds()
        return self._fit

    @property
    def decode_seconds(self) -> float | None:
        medians = self.median_seconds()
        if 1 in medians:
            return medians[1]
        fit = self._fit
        return None if fit is None else fit[0] + fit[1]

    @property
    def verify_cost(self) -> float:
        """The fitted cost of one more token in a verify row, in plain decode steps (clamped to [0.01, 2])."""
        fit, decode = self.fit(), self.decode_seconds
        if fit is None or decode is None or decode <= 0:
            return self.prior_verify_cost
        return min(2.0, max(0.01, fit[1] / decode))

    def row_cost(self, k: int) -> float:
        """A batch-1 step of 1 + k tokens, in plain decode steps (1 for k = 0)."""
        decode = self.decode_seconds
        if k == 0 or decode is None or decode <= 0:
            return 1.0 + self.prior_verify_cost * k
        medians = self.median_seconds()
        n = k + 1
        if len(self.samples.get(n, ())) >= self.min_samples:
            return medians[n] / decode
        shorter = [medians[m] for m in medians if 1 < m < n and len(self.samples[m]) >= self.min_samples]
        floor = max(shorter, default=decode) / decode
        return max(floor, 1.0 + self.verify_cost * k)

    @property
    def draft_cost(self) -> float:
        """The proposer's time per drafted token, as a fraction of a plain decode step."""
        decode = self.decode_seconds
        if self.draft_seconds is None or decode is None or decode <= 0:
            return 0.0
        return min(2.0, self.draft_seconds / decode)

    def step_cost(self, k: int) -> float:
        """A verify step of k drafts, proposing included, in plain decode steps."""
        return self.row_cost(k) + self.draft_cost * k


@dataclass(slots=True)
class DraftPolicy:
    """Per-sequence draft lengths from acceptance and measured cost (see the module docstring)."""

    max_drafts: int
    costs: StepCosts
    prior_alpha: float = 0.5
    prior_weight: float = 2.0  # the prior counts as this many drafts
    decay: float = 0.8  # per verify step: recent acceptance counts most
    margin: float = 0.5  # standard errors below the acceptance estimate that decisions use
    shadow_every: int = 8  # shadow drafts of a costly proposer: one per this many steps
    sequences: dict[str, Acceptance] = field(default_factory=dict)
    steps_since_shadow: dict[str, int] = field(default_factory=dict)

    def acceptance(self, seq_id: str) -> Acceptance:
        if seq_id not in self.sequences:
            self.sequences[seq_id] = Acceptance(self.prior_alpha * self.prior_weight, self.prior_weight)
        return self.sequences[seq_id]

    def num_drafts(self, seq_id: str) -> int:
        alpha = self.acceptance(seq_id).lower_bound(self.margin)
        return best_num_drafts(alpha, self.costs.step_cost, self.max_drafts)

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
