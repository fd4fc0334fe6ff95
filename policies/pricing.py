"""Token pricing in integer micro-units: no floats anywhere.

Units. Prices are configured per model as decimal *strings* per million tokens in the
currency's main unit (e.g. "0.60" USD per 1M input tokens). `parse_rate` turns them, through
`decimal.Decimal`, into integer **micro-units per million tokens** (0.60 -> 600_000), so a rate
may have at most 6 decimal places; more precision is refused rather than silently rounded.
Costs come out in integer **micro-units** of the currency (1e-6 USD). Neurons (Workers AI's unit)
work the same way: neurons per million tokens -> micro-neurons per million -> micro-neurons.

Rounding, defined once (`_div_round_up`): a request's exact cost is
    (uncached_input x input_rate + cached x cached_rate + output x output_rate) / 1e6  micro-units,
summed exactly as integers over the whole request and rounded up once at the end, to the next
whole micro-unit. So a request that uses any priced token costs at least 1 micro-unit: a budget is
a hard stop (rounding half up made requests under half a micro-unit free, past an exhausted budget
too). One request is billed less than 1 micro-unit above its exact cost, never below it; the
budget reservation (the worst case) and the ledger (the real usage) round the same way, and the
rounding only goes up with the tokens, so a reservation always covers its request's cost. Splitting
usage in two parts changes the total by at most 1 micro-unit.

A model without a cached-input rate bills cached tokens as input. A cached rate above the input
rate is refused. Savings = what the cached tokens would have cost as input minus what they cost,
i.e. cost with no cached tokens minus the actual cost (both rounded the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from contracts.usage import Usage
from policies.errors import PricingError

TOKENS_PER_RATE = 1_000_000  # rates are per million tokens
_RATE_KEYS = ("input", "output", "cached_input", "input_neurons", "output_neurons", "cached_input_neurons")


@dataclass(slots=True, frozen=True)
class Price:
    """One model's rates in micro-units per million tokens, and the price version that set them."""

    model: str
    version: str
    input: int
    output: int
    cached_input: int | None = None  # None: cached tokens are billed as input
    input_neurons: int | None = None  # micro-neurons per million tokens (optional)
    output_neurons: int | None = None
    cached_input_neurons: int | None = None

    def __post_init__(self) -> None:
        for name in _RATE_KEYS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise PricingError(f"{self.model}: rate {name}={value!r} must be a non-negative integer")
        if self.cached_input is not None and self.cached_input > self.input:
            raise PricingError(f"{self.model}: cached_input rate is above the input rate")
        if (self.input_neurons is None) != (self.output_neurons is None):
            raise PricingError(f"{self.model}: give both input_neurons and output_neurons, or neither")
        if self.cached_input_neurons is not None and (
            self.input_neurons is None or self.cached_input_neurons > self.input_neurons
        ):
            raise PricingError(f"{self.model}: cached_input_neurons needs input_neurons and must not exceed it")

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, object]) -> Price:
        """From `{"version": "2026-01", "input": "0.60", "cached_input": "0.10", "output": "3"}`."""
        known = {"version", *_RATE_KEYS}
        if unknown := set(config) - known:
            raise PricingError(f"{model}: unknown price keys {sorted(unknown)}; valid: {sorted(known)}")
        for required in ("version", "input", "output"):
            if required not in config:
                raise PricingError(f"{model}: price needs {required!r}")
        rates = {k: parse_rate(v, f"{model}.{k}") for k, v in config.items() if k != "version"}
        return cls(model=model, version=str(config["version"]), **rates)


def parse_rate(value: object, where: str = "rate") -> int:
    """A decimal string (or int) per million tokens -> integer micro-units per million tokens."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PricingError(f"{where}={value!r}: write prices as decimal strings like \"0.60\" (no floats)")
    try:
        amount = Decimal(value) if isinstance(value, int) else Decimal(value.strip())
    except InvalidOperation:
        raise PricingError(f"{where}={value!r} is not a decimal number") from None
    if not amount.is_finite() or amount < 0:
        raise PricingError(f"{where}={value!r} must be a finite, non-negative number")
    micros = amount.scaleb(6)
    if micros != micros.to_integral_value():
        raise PricingError(f"{where}={value!r} has more than 6 decimal places")
    return int(micros)


def format_micros(micros: int) -> str:
    """Micro-units as a plain decimal string in main units: 1_234_500 -> "1.234500"."""
    return f"{Decimal(micros).scaleb(-6):.6f}"


def _div_round_up(numerator: int, denominator: int) -> int:
    """The one rounding rule: non-negative numerator / denominator, rounded up to a whole unit."""
    return -(-numerator // denominator)


def _amount(usage: Usage, input_rate: int, cached_rate: int | None, output_rate: int) -> int:
    cached = input_rate if cached_rate is None else cached_rate
    exact = (
        usage.uncached_prompt_tokens * input_rate
        + usage.cached_tokens * cached
        + usage.completion_tokens * output_rate
    )  # micro-units x 1e6, exact
    return _div_round_up(exact, TOKENS_PER_RATE)


def cost_micros(usage: Usage, price: Price) -> int:
    """What the request costs, in micro-units of the currency."""
    return _amount(usage, price.input, price.cached_input, price.output)


def savings_micros(usage: Usage, price: Price) -> int:
    """What the cached tokens saved: the cost had they been billed as input, minus the cost."""
    return cost_micros(Usage(usage.prompt_tokens, usage.completion_tokens), price) - cost_micros(usage, price)


def neurons_micros(usage: Usage, price: Price) -> int | None:
    """Micro-neurons for the request, or None when the model has no neuron rates."""
    if price.input_neurons is None or price.output_neurons is None:
        return None
    return _amount(usage, price.input_neurons, price.cached_input_neurons, price.output_neurons)


@dataclass(slots=True, frozen=True)
class Charge:
    """What the ledger records for one request."""

    model: str
    price_version: str
    cost_micros: int
    savings_micros: int
    neurons_micros: int | None


def charge(usage: Usage, price: Price) -> Charge:
    return Charge(
        model=price.model,
        price_version=price.version,
        cost_micros=cost_micros(usage, price),
        savings_micros=savings_micros(usage, price),
        neurons_micros=neurons_micros(usage, price),
    )


@dataclass(slots=True, frozen=True)
class PriceTable:
    """Prices by model id."""

    prices: Mapping[str, Price]

    @classmethod
    def from_config(cls, config: Mapping[str, Mapping[str, object]]) -> PriceTable:
        return cls({model: Price.from_config(model, entry) for model, entry in config.items()})

    def price_for(self, model: str) -> Price:
        price = self.prices.get(model)
        if price is None:
            raise PricingError(f"no price configured for model {model!r}; add it to the price table")
        return price
