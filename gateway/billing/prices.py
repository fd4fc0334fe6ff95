"""Price configuration: the default table and the history of every price version.

Prices are configured in `GatewaySettings.billing.prices` (model id -> `{version, input, cached_input,
output, input_neurons, cached_input_neurons, output_neurons}`, decimal strings per million
tokens, see `policies.pricing`). Each ledger record keeps the `price_version` it was billed
under, so a bill can be recomputed from raw usage as long as that version's rates are known:
when prices change, move the old entry to `price_history` instead of deleting it:

    [prices."@cf/huggingface/smollm2-135m-instruct"]
    version = "2026-10"
    input = "0.030"
    output = "0.220"

    [[price_history."@cf/huggingface/smollm2-135m-instruct"]]
    version = "2026-09"
    input = "0.027"
    cached_input = "0.0045"
    output = "0.201"
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.fleet.catalog import DEFAULT_MODEL_ID, EMBEDDING_MODEL_ID
from policies.errors import PricingError
from policies.pricing import Price

DEFAULT_PRICE_VERSION = "2026-09"


def default_prices() -> dict[str, dict[str, str | int]]:
    """The default model priced like Workers AI's smallest text model (@cf/meta/llama-3.2-1b-instruct,
    $0.027 / $0.201 per M input / output tokens, 2457 / 18252 neurons per M), with cached input at
    a sixth of the input rate (the Kimi K2.5 ratio, $0.10 vs $0.60 per M). The embedding model is
    priced like Workers AI's smallest embedding model (@cf/baai/bge-small-en-v1.5, $0.020 and 1841
    neurons per M input tokens; embeddings have no output tokens)."""
    return {
        DEFAULT_MODEL_ID: {
            "version": DEFAULT_PRICE_VERSION,
            "input": "0.027",
            "cached_input": "0.0045",
            "output": "0.201",
            "input_neurons": "2457",
            "cached_input_neurons": "409.5",
            "output_neurons": "18252",
        },
        EMBEDDING_MODEL_ID: {
            "version": DEFAULT_PRICE_VERSION,
            "input": "0.020",
            "output": "0",
            "input_neurons": "1841",
            "output_neurons": "0",
        },
    }


@dataclass(frozen=True, slots=True)
class PriceHistory:
    """Every known price, by (model, version): the current table plus older versions."""

    prices: Mapping[tuple[str, str], Price]

    @classmethod
    def from_config(
        cls,
        current: Mapping[str, Mapping[str, object]],
        history: Mapping[str, Iterable[Mapping[str, object]]] | None = None,
    ) -> PriceHistory:
        """From `settings.prices` and `settings.price_history`. A version names one set of rates:
        the same (model, version) configured twice with different rates is refused."""
        found: dict[tuple[str, str], Price] = {}
        entries = [(model, entry) for model, entry in current.items()]
        entries += [(model, entry) for model, versions in (history or {}).items() for entry in versions]
        for model, entry in entries:
            price = Price.from_config(model, entry)
            key = (model, price.version)
            if key in found and found[key] != price:
                raise PricingError(f"{model}: price version {price.version!r} is configured twice with different rates")
            found[key] = price
        return cls(found)

    def get(self, model: str, version: str) -> Price | None:
        return self.prices.get((model, version))
