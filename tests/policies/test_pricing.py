from __future__ import annotations

from decimal import ROUND_CEILING, Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.usage import Usage
from policies.errors import PricingError
from policies.pricing import (
    Price,
    PriceTable,
    charge,
    cost_micros,
    format_micros,
    neurons_micros,
    parse_rate,
    savings_micros,
)

KIMI = Price.from_config(
    "@cf/moonshotai/kimi-k2.5", {"version": "2026-01", "input": "0.60", "cached_input": "0.10", "output": "3.00"}
)

counts = st.integers(0, 10**12)
rates = st.integers(0, 10**9)  # micro-units per million tokens, up to 1000 per million


@st.composite
def prices(draw: st.DrawFn) -> Price:
    input_rate = draw(rates)
    cached = draw(st.none() | st.integers(0, input_rate))
    return Price("m", "v1", input=input_rate, output=draw(rates), cached_input=cached)


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    prompt = draw(counts)
    return Usage(prompt, draw(counts), draw(st.integers(0, prompt)))


def test_rates_are_parsed_into_integer_micros_per_million() -> None:
    assert (KIMI.input, KIMI.cached_input, KIMI.output) == (600_000, 100_000, 3_000_000)
    assert parse_rate(" 0.000001 ") == 1
    assert parse_rate(3) == 3_000_000
    assert parse_rate("1e-3") == 1000


def test_kimi_example() -> None:
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=800_000)
    # 200k x 0.60 + 800k x 0.10 + 100k x 3.00 per million = 0.12 + 0.08 + 0.30
    assert cost_micros(usage, KIMI) == 500_000
    assert savings_micros(usage, KIMI) == 400_000  # 800k x (0.60 - 0.10)
    assert format_micros(cost_micros(usage, KIMI)) == "0.500000"


def test_rounding_is_up_once_over_the_whole_request() -> None:
    price = Price("m", "v", input=400_000, output=500_000)  # 0.4 and 0.5 micro-units per token
    assert cost_micros(Usage(1, 0), price) == 1  # 0.4: never free (half up gave 0)
    assert cost_micros(Usage(0, 1), price) == 1  # 0.5
    assert cost_micros(Usage(3, 0), price) == 2  # 1.2, not 3 x ceil(0.4) = 3
    assert cost_micros(Usage(1, 1), price) == 1  # 0.9: summed, then rounded
    assert cost_micros(Usage(5, 0), price) == 2  # exactly 2: nothing added
    assert cost_micros(Usage(0, 0), price) == 0
    tiny = Price("m", "v", input=1, output=1)  # a millionth of a micro-unit per token
    assert cost_micros(Usage(1, 0), tiny) == 1


def test_model_without_cached_price_bills_cached_tokens_as_input() -> None:
    price = Price.from_config("m", {"version": "v", "input": "1", "output": "2"})
    usage = Usage(1000, 10, cached_tokens=900)
    assert cost_micros(usage, price) == cost_micros(Usage(1000, 10), price) == 1020
    assert savings_micros(usage, price) == 0


def test_neurons_are_optional_and_integer() -> None:
    assert neurons_micros(Usage(10, 10), KIMI) is None
    price = Price.from_config(
        "m", {"version": "v", "input": "0.1", "output": "1", "input_neurons": "25608", "output_neurons": "75147"}
    )
    assert neurons_micros(Usage(1_000_000, 1_000_000), price) == (25_608 + 75_147) * 1_000_000
    result = charge(Usage(100, 10, 50), price)
    assert result.price_version == "v" and result.neurons_micros == neurons_micros(Usage(100, 10, 50), price)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0.6, "no floats"),
        ("0.0000001", "more than 6 decimal places"),
        ("abc", "not a decimal"),
        ("-1", "non-negative"),
        ("NaN", "finite"),
        ("Infinity", "finite"),
        (True, "no floats"),
    ],
)
def test_bad_rates_are_refused(value: object, message: str) -> None:
    with pytest.raises(PricingError, match=message):
        parse_rate(value)


def test_bad_price_configs_are_refused() -> None:
    with pytest.raises(PricingError, match="above the input"):
        Price.from_config("m", {"version": "v", "input": "0.1", "cached_input": "0.2", "output": "1"})
    with pytest.raises(PricingError, match="unknown price keys"):
        Price.from_config("m", {"version": "v", "input": "1", "output": "1", "cache": "0.1"})
    with pytest.raises(PricingError, match="needs 'version'"):
        Price.from_config("m", {"input": "1", "output": "1"})
    with pytest.raises(PricingError, match="both input_neurons"):
        Price.from_config("m", {"version": "v", "input": "1", "output": "1", "input_neurons": "5"})


def test_price_table_lookup() -> None:
    table = PriceTable.from_config({"a": {"version": "1", "input": "1", "output": "2"}})
    assert table.price_for("a").output == 2_000_000
    with pytest.raises(PricingError, match="no price configured"):
        table.price_for("b")


@given(rates)
def test_decimal_strings_round_trip(micros: int) -> None:
    assert parse_rate(f"{micros // 10**6}.{micros % 10**6:06d}") == micros


@given(usages(), prices())
def test_cost_is_the_exact_cost_rounded_up(usage: Usage, price: Price) -> None:
    cost = cost_micros(usage, price)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    exact = Decimal(
        usage.uncached_prompt_tokens * price.input
        + usage.cached_tokens * cached_rate
        + usage.completion_tokens * price.output
    ) / Decimal(10**6)
    assert exact <= cost < exact + 1  # never below the exact cost: no request is free


@given(counts, counts, counts, prices(), st.sampled_from(["uncached", "cached", "output"]), st.integers(1, 10**6))
def test_cost_is_monotone_in_each_token_count(
    uncached: int, cached: int, output: int, price: Price, which: str, extra: int
) -> None:
    base = Usage(uncached + cached, output, cached)
    more = {
        "uncached": Usage(uncached + cached + extra, output, cached),
        "cached": Usage(uncached + cached + extra, output, cached + extra),
        "output": Usage(uncached + cached, output + extra, cached),
    }[which]
    assert cost_micros(more, price) >= cost_micros(base, price)


@given(usages(), prices())
def test_cached_tokens_never_cost_more_than_input(usage: Usage, price: Price) -> None:
    as_input = Usage(usage.prompt_tokens, usage.completion_tokens)
    assert cost_micros(usage, price) <= cost_micros(as_input, price)
    assert savings_micros(usage, price) == cost_micros(as_input, price) - cost_micros(usage, price) >= 0


@given(usages(), usages(), prices())
def test_splitting_a_usage_changes_the_cost_by_at_most_one_micro(a: Usage, b: Usage, price: Price) -> None:
    assert abs(cost_micros(a + b, price) - cost_micros(a, price) - cost_micros(b, price)) <= 1


@given(st.integers(0, 10**40), st.integers(0, 10**40), st.integers(0, 10**15))
def test_huge_numbers_are_exact(prompt: int, output: int, rate: int) -> None:
    price = Price("m", "v", input=rate, output=rate + 1)
    with localcontext() as ctx:
        ctx.prec = 200
        exact = (Decimal(prompt) * rate + Decimal(output) * (rate + 1)) / Decimal(10**6)
        expected = int(exact.to_integral_value(rounding=ROUND_CEILING))
    assert cost_micros(Usage(prompt, output), price) == expected
