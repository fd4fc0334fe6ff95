"""Server-sent events, read from a stream of lines: one `data` payload per event.

Only what OpenAI-compatible servers send is handled: `data:` lines (joined with newlines when
an event has several), comment lines starting with ":" (keep-alives), and blank lines ending an
event. `event:`, `id:` and `retry:` fields are ignored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def iter_sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Yield the data of each event in `lines` (without their line endings)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:  # a last event the server did not end with a blank line
        yield "\n".join(data)
