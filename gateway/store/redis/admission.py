"""`RedisAdmission`: rate windows, budgets and concurrency slots in Redis; `admit` and `settle` one script each.

Every check-and-change is one Lua script (scripts.py), so replicas never race. The window counters
are named inside the scripts from Redis's clock (`TIME`), so replicas with skewed clocks share one
window. `settle` gives everything back and appends the ledger record in the same script
(`RedisLedger.record_args`). If Redis refuses it for being full, what it gives back is given back
by a second script that Redis runs even then (`RELEASE_WHEN_FULL`: slots and in-flight tokens are
freed at once, a reservation larger than the cost is taken back), and the record goes to the
gateway's spool as before.

An `admit` call that fails with a timeout or a lost connection (Redis paused, slow, a network fault)
may still be applied by Redis later (it was only slow), and its caller, answered 503, settles
nothing. Each call carries a token that its script marks when it applies; a failed call's token
goes to a background task (`undo.py`, drained or stopped by `aclose`) that takes a reservation back,
or marks the token so that the call takes nothing when it lands. A call that succeeds pays one SET
inside its script, no extra round trip. (A late admit's slot lapses with its lease; its in-flight
tokens stay counted until the backend's /load report corrects them.)
"""

from __future__ import annotations

import asyncio
from secrets import token_hex
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.admission import Admitted, Claim, Release, check_release_record
from gateway.store.checks import check_id, check_month
from gateway.store.limits import ALLOWED, WINDOW_MS, limits_apply, refused, to_ms
from gateway.store.models import LimitDecision, UsageRecord
from gateway.store.redis.connection import RedisConnection, redis_errors
from gateway.store.redis.ledger import RedisLedger
from gateway.store.redis.pool import PoolExhausted
from gateway.store.redis.undo import ReservationUndo

_BUDGET_TTL_S = 45 * 24 * 3600  # a month's counter outlives the month
_TOKEN_TTL_S = 120  # a call's token outlives its undo's tries (half of it) and a late arrival after them
_UNDO_CLOSE_WAIT_S = 5.0  # aclose gives queued undos this long
_REFUSALS = {1: "slot", 2: "tpm", 3: "budget"}


def _opt(value: object | None) -> object:
    return "" if value is None else value


class RedisAdmission:
    admits_at_once = False  # a script on Redis: it may land after its caller has gone

    def __init__(self, connection: RedisConnection, ledger: RedisLedger) -> None:
        self._c = connection
        self._names = connection.names
        self._ledger = ledger
        self._undo = ReservationUndo(
            lambda keys: connection.script("UNDO_RESERVATIONS")(keys=keys, args=[_TOKEN_TTL_S]),
            give_up_after_s=_TOKEN_TTL_S / 2,
        )

    @redis_errors
    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        if not limits_apply(key_id, rpm, tpm, tokens_estimate):
            return ALLOWED
        # The script names the window counters itself, from Redis's clock unless a time is given.
        rpm_retry, tpm_retry = await self._c.script("CHECK_AND_CONSUME")(
            keys=[],
            args=["" if now is None else to_ms(now), WINDOW_MS, _opt(rpm), _opt(tpm), tokens_estimate,
                  self._names.limit_scope(key_id, "rpm"), self._names.limit_scope(key_id, "tpm")],
        )
        if rpm_retry == 0 and tpm_retry == 0:
            return ALLOWED
        return refused(rpm_retry or None, tpm_retry or None)

    @redis_errors
    async def admit(self, claim: Claim, now: float | None = None) -> Admitted:
        n, c = self._names, self._c
        spend_key = n.budget(claim.tenant_id, claim.month or "none")
        token_key = n.budget_token(token_hex(12))
        if claim.slot_limit is not None or claim.inflight is not None:
            c.hold_lease()
        inflight = claim.inflight
        try:
            outcome, retry_ms, spent = await c.script("ADMIT")(
                keys=[n.request_slots(claim.tenant_id), spend_key, token_key, *c.inflight_keys()],
                args=[
                    claim.request_id, _opt(claim.slot_limit), c.lease_ms, "" if now is None else to_ms(now), WINDOW_MS,
                    _opt(claim.tpm), claim.tokens, n.limit_scope(claim.key_id or "", "tpm"),
                    "" if claim.month is None else claim.amount_micro, _opt(claim.budget_micro), _BUDGET_TTL_S,
                    _TOKEN_TTL_S, "" if inflight is None else inflight.backend_id,
                    0 if inflight is None else inflight.prefill_tokens, 0 if inflight is None else inflight.decode_tokens,
                    c.replica,
                ],
            )
        except PoolExhausted:
            raise  # never sent
        except (RedisConnectionError, RedisTimeoutError, asyncio.CancelledError):
            # Sent, perhaps applied (or about to be): nobody will settle it, so its reservation is taken back,
            # or the call stopped before it lands, in the background (undo.py).
            if claim.month is not None:
                self._undo.add(spend_key, token_key)
            raise
        if outcome != 0:
            refusal: Any = _REFUSALS[int(outcome)]
            return Admitted(False, refusal, retry_after_s=int(retry_ms) / 1000, spent_micro=int(spent))
        if claim.slot_limit is not None:
            c.holds_slot(claim.tenant_id, claim.request_id)
        return Admitted(True, spent_micro=int(spent))

    @redis_errors
    async def settle(self, release: Release, record: UsageRecord | None = None, now: float | None = None) -> bool | None:
        check_release_record(release, record)
        n, c = self._names, self._c
        if release.slot:
            c.drops_slot(release.tenant_id, release.request_id)
        inflight = release.inflight
        keys = [n.request_slots(release.tenant_id), n.budget(release.tenant_id, release.month or "none"),
                *c.inflight_keys()]
        args: list[Any] = [
            release.request_id, "1" if release.slot else "", release.tokens_delta, "" if now is None else to_ms(now),
            WINDOW_MS, n.limit_scope(release.key_id or "", "tpm"),
            "" if release.month is None else release.cost_micro - release.reserved_micro, _BUDGET_TTL_S,
            "" if inflight is None else inflight.backend_id, 0 if inflight is None else inflight.prefill_tokens,
            0 if inflight is None else inflight.decode_tokens, c.lease_ms, c.replica,
        ]
        ledger_keys, ledger_args = ([], []) if record is None else self._ledger.record_args(record)
        try:
            written = await c.script("SETTLE")(keys=[*keys, *ledger_keys], args=[*args, *ledger_args])
        except OutOfMemoryError:
            await c.script("RELEASE_WHEN_FULL")(keys=keys, args=args)
            raise
        return None if written == -1 else written == 1

    @redis_errors
    async def budget_spent(self, tenant_id: str, month: str) -> int:
        check_id("tenant id", tenant_id)
        return int(await self._c.redis.get(self._names.budget(tenant_id, check_month(month))) or 0)

    async def aclose(self) -> None:
        await self._undo.aclose(_UNDO_CLOSE_WAIT_S)  # before the connections go
