"""Model aliases in the catalog: lookups, listing and the checks made when the catalog is built."""

from __future__ import annotations

import pytest

from gateway.errors import NoSuchModel
from gateway.fleet.catalog import DEFAULT_MODEL_ID, Catalog, default_models

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def catalog() -> Catalog:
    return Catalog.build(default_models(), [], {LLAMA: DEFAULT_MODEL_ID})


def test_an_alias_names_its_served_model() -> None:
    assert catalog().get(LLAMA).id == DEFAULT_MODEL_ID
    assert catalog().get(DEFAULT_MODEL_ID).id == DEFAULT_MODEL_ID
    with pytest.raises(NoSuchModel):
        catalog().get("@cf/meta/llama-3.3-70b-instruct-fp8-fast")


def test_search_lists_aliases_with_what_they_name() -> None:
    found = {m["name"]: m for m in catalog().search()}
    assert set(found) == {DEFAULT_MODEL_ID, LLAMA}
    assert {"property_id": "alias_of", "value": DEFAULT_MODEL_ID} in found[LLAMA]["properties"]
    assert found[LLAMA]["id"] != found[DEFAULT_MODEL_ID]["id"]
    assert [m["name"] for m in catalog().search(author="meta")] == [LLAMA]
    assert [m["name"] for m in catalog().search(search="llama-3.1")] == [LLAMA]


@pytest.mark.parametrize(
    ("aliases", "why"),
    [({LLAMA: "@cf/nobody/nothing"}, "not in the catalog"), ({DEFAULT_MODEL_ID: DEFAULT_MODEL_ID}, "already a model")],
)
def test_bad_aliases_stop_the_start(aliases: dict[str, str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Catalog.build(default_models(), [], aliases)
