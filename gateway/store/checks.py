"""Argument checks shared by both stores, so they refuse the same inputs with the same message."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gateway.store.errors import InvalidArgument

# Ids that become part of store keys: no ":" or spaces, bounded length.
_ID_RE = re.compile(r"[A-Za-z0-9_.\-@]{1,128}")
_MONTH_RE = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
_INT64 = (-(2**63), 2**63 - 1)


def check_id(kind: str, value: object) -> str:
    """Return `value` if it is a usable id (1-128 letters, digits or _.-@), else raise."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidArgument(f"{kind} {value!r} is not a valid id: use 1-128 letters, digits or _.-@")
    return value


def check_text(kind: str, value: object, max_chars: int = 256) -> str:
    """Return `value` if it is a non-empty string of at most `max_chars` characters."""
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        raise InvalidArgument(f"{kind} must be a non-empty string of at most {max_chars} characters")
    return value


def check_count(kind: str, value: object, *, allow_none: bool = False, positive: bool = False) -> None:
    """Raise unless `value` is a non-negative int (positive if asked; None if allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if positive else 0):
        raise InvalidArgument(f"{kind} must be {'a positive' if positive else 'a non-negative'} integer, got {value!r}")


def check_month(value: object) -> str:
    if not isinstance(value, str) or not _MONTH_RE.fullmatch(value):
        raise InvalidArgument(f"month {value!r} must look like 2026-05")
    return value


def check_hashes(block_hashes: Sequence[int]) -> list[int]:
    """Block hashes are signed 64-bit ints (`policies.prefix`)."""
    hashes = list(block_hashes)
    for h in hashes:
        if isinstance(h, bool) or not isinstance(h, int) or not _INT64[0] <= h <= _INT64[1]:
            raise InvalidArgument(f"block hash {h!r} is not a signed 64-bit integer")
    return hashes


def check_accounts(account_ids: Iterable[str]) -> tuple[str, ...]:
    """One or more distinct account ids, in the order given."""
    if isinstance(account_ids, str):
        raise InvalidArgument("account_ids must be a list of account ids, not one string")
    accounts = tuple(check_id("account id", a) for a in account_ids)
    if not accounts or len(set(accounts)) != len(accounts):
        raise InvalidArgument("a tenant needs one or more distinct account ids")
    return accounts


def check_models(value: Iterable[str] | None) -> frozenset[str] | None:
    """An allow-list of model ids, or None for all models."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
        raise InvalidArgument("allowed models must be a collection of model ids (or None for all)")
    return frozenset(value)


def check_tokens(backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
    """In-flight tokens on a backend (`admission.Inflight`, `RoutingState.correct_inflight`)."""
    check_text("backend id", backend_id)
    check_count("prefill_tokens", prefill_tokens)
    check_count("decode_tokens", decode_tokens)
