"""Price configuration: the default table, TOML loading, and the history of versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.usage import Usage
from gateway.billing.prices import DEFAULT_PRICE_VERSION, PriceHistory, default_prices
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.settings import GatewaySettings
from policies.errors import PricingError
from policies.pricing import PriceTable, cost_micros, neurons_micros

MODEL = "@cf/test/m"
TOML = f'''
[prices."{MODEL}"]
version = "2026-10"
input = "0.60"
output = "3"

[[price_history."{MODEL}"]]
version = "2026-09"
input = "0.50"
cached_input = "0.10"
output = "2.5"
'''


def test_the_default_model_is_priced_by_default() -> None:
    table = PriceTable.from_config(GatewaySettings(redis_url=None).billing.prices)
    price = table.price_for(DEFAULT_MODEL_ID)
    assert price.version == DEFAULT_PRICE_VERSION
    # 1M input tokens, 400k of them cached, and 100k output tokens, at 0.027 / 0.0045 / 0.201 per M:
    # 600k x 0.027 + 400k x 0.0045 + 100k x 0.201 = 0.0162 + 0.0018 + 0.0201 = 0.0381
    assert cost_micros(Usage(1_000_000, 100_000, 400_000), price) == 38_100
    assert neurons_micros(Usage(1_000_000, 0, 0), price) == 2457 * 1_000_000


def test_prices_and_history_load_from_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(TOML)
    monkeypatch.setenv("EDGERUN_CONFIG", str(config))
    settings = GatewaySettings()
    history = PriceHistory.from_config(settings.billing.prices, settings.billing.price_history)
    current, old = history.get(MODEL, "2026-10"), history.get(MODEL, "2026-09")
    assert current is not None and old is not None and history.get(MODEL, "2025-01") is None
    assert (current.input, current.cached_input, current.output) == (600_000, None, 3_000_000)
    assert (old.input, old.cached_input, old.output) == (500_000, 100_000, 2_500_000)
    assert DEFAULT_MODEL_ID not in settings.billing.prices  # a configured table replaces the default one


def test_a_model_without_a_cached_price_bills_cached_tokens_as_input() -> None:
    price = PriceTable.from_config({MODEL: {"version": "v", "input": "0.60", "output": "3"}}).price_for(MODEL)
    assert cost_micros(Usage(1000, 10, 800), price) == cost_micros(Usage(1000, 10, 0), price) == 630


def test_a_version_names_one_set_of_rates() -> None:
    current = {MODEL: {"version": "v1", "input": "0.60", "output": "3"}}
    assert PriceHistory.from_config(current, {MODEL: [{"version": "v1", "input": "0.60", "output": "3"}]})
    with pytest.raises(PricingError, match="configured twice"):
        PriceHistory.from_config(current, {MODEL: [{"version": "v1", "input": "0.70", "output": "3"}]})


def test_default_prices_are_fresh_copies() -> None:
    first = default_prices()
    first[DEFAULT_MODEL_ID]["input"] = "9"
    assert default_prices()[DEFAULT_MODEL_ID]["input"] == "0.027"
