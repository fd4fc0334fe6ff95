"""GET /admin/v1/billing/export: the billing export over HTTP (admin token), as `edgerun billing export`.

    GET /admin/v1/billing/export?from=2026-11-01&to=2026-12-01[&tenant=T][&format=csv|jsonl|parquet][&part=rows|summary]

`part=rows` (the default) answers one row per request, `part=summary` the per-(tenant, model)
totals; both in `format` (default csv), as an attachment. The export is written to a temporary
file first (spilled to disk past 8 MiB), then streamed, so a broken ledger read never yields half
a file with a 200.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import BinaryIO, cast

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.billing.export import ExportQuery, write_export
from gateway.billing.formats import FORMATS, MEDIA_TYPES, Format
from gateway.billing.prices import PriceHistory
from gateway.errors import InternalError, InvalidInput
from gateway.http.api_admin import require_admin
from gateway.store.errors import InvalidArgument
from policies.errors import PricingError

PARTS = ("rows", "summary")
_CHUNK = 1 << 16




def _choice(request: Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query_params.get(name, default)
    if value not in choices:
        raise InvalidInput(f"{name} must be one of {', '.join(choices)}", param=name)
    return value


def _query(request: Request) -> ExportQuery:
    params = request.query_params
    for name in ("from", "to"):
        if not params.get(name):
            raise InvalidInput(f"{name} is required: an ISO 8601 date or time, e.g. 2026-11-01", param=name)
    try:
        return ExportQuery.parse(params["from"], params["to"], params.get("tenant"))
    except ValueError as exc:
        raise InvalidInput(str(exc), param="from") from None


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    with file:
        file.seek(0)
        while chunk := file.read(_CHUNK):
            yield chunk


async def billing_export(request: Request) -> Response:
    g = require_admin(request)
    query = _query(request)
    fmt = cast(Format, _choice(request, "format", FORMATS, "csv"))
    part = _choice(request, "part", PARTS, "rows")
    try:
        history = PriceHistory.from_config(g.settings.billing.prices, g.settings.billing.price_history)
    except PricingError as exc:
        raise InternalError(f"the price configuration is invalid: {exc}") from exc
    out = cast(BinaryIO, tempfile.SpooledTemporaryFile(max_size=8 << 20))
    try:
        rows_out, summary_out = (out, None) if part == "rows" else (None, out)
        await write_export(g.store.ledger, query, history, fmt, rows_out, summary_out)
    except InvalidArgument as exc:
        out.close()
        raise InvalidInput(str(exc), param="tenant") from exc
    except BaseException:
        out.close()
        raise
    filename = f"billing-{part}.{fmt}"
    headers = {"content-disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(_chunks(out), media_type=MEDIA_TYPES[fmt], headers=headers)
