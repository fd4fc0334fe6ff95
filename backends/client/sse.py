"""Server-sent events, read from the bytes of a response body: one `data` payload per event.

Only what OpenAI-compatible servers send is handled: `data:` lines (joined with newlines when
an event has several), comment lines starting with ":" (keep-alives), and blank lines ending an
event. `event:`, `id:` and `retry:` fields are ignored. Lines end with LF, CRLF or CR, and may
be split anywhere between two reads (a UTF-8 character too: lines are decoded whole).
"""

from __future__ import annotations


class SSEDecoder:
    """Feed it body bytes as they arrive; it returns the data of each event they complete."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        buffer = self._buffer + chunk
        if b"\r" not in buffer:
            return self._feed_lf(buffer)
        lines = buffer.splitlines(keepends=True)  # bytes split only on \n, \r\n and \r
        if lines and not lines[-1].endswith((b"\n", b"\r")) or buffer.endswith(b"\r"):
            self._buffer = lines.pop()  # unfinished (a lone \r may be the first half of \r\n)
        else:
            self._buffer = b""
        found: list[str] = []
        for raw in lines:
            event = self._line(raw.rstrip(b"\r\n").decode("utf-8", errors="replace"))
            if event is not None:
                found.append(event)
        return found

    def _feed_lf(self, buffer: bytes) -> list[str]:
        """`feed` for bytes whose lines all end with LF (what servers send): split into events at
        blank lines, and an event that is one `data: ` line taken whole. An unfinished event stays
        in the buffer, whole lines and all."""
        blocks = buffer.split(b"\n\n")
        self._buffer = blocks.pop()
        found: list[str] = []
        for block in blocks:
            if not self._data and block.startswith(b"data: ") and b"\n" not in block:
                found.append(block[6:].decode("utf-8", errors="replace"))
                continue
            for raw in block.split(b"\n"):  # the general way: each line, then the blank line
                event = self._line(raw.decode("utf-8", errors="replace"))
                if event is not None:
                    found.append(event)
            event = self._line("")
            if event is not None:
                found.append(event)
        return found

    def end(self) -> list[str]:
        """The body is over: the data of a last event the server did not end with a blank line."""
        found: list[str] = []
        buffer, self._buffer = self._buffer, b""
        for raw in buffer.splitlines():  # what is left: whole lines (LF) and perhaps an unfinished one
            event = self._line(raw.decode("utf-8", errors="replace"))
            if event is not None:
                found.append(event)
        if self._data:
            found.append("\n".join(self._data))
            self._data = []
        return found

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            event, self._data = "\n".join(self._data), []
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None
