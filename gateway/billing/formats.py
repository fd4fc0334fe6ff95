"""Writing export rows as CSV, JSONL or Parquet, byte for byte the same for the same rows.

Every writer takes the columns in a fixed order and rows as dicts of str, int or None, and adds
nothing that depends on when or where it runs:
- csv: RFC 4180 quoting where needed (a field holding a comma, a quote, CR or LF), "\\n" line ends,
  a header line, None as an empty field; in the columns a client chose the text of (`client_text`),
  a cell that a spreadsheet would run as a formula (it starts with =, +, -, @, tab or CR: OWASP's
  CSV injection rule) gets a leading "'", which `read_rows` removes again (a cell that already
  starts with "'" before such a character gets one more, so the escape reads back exactly); the
  export's own values (ids such as "@cf/...", times, numbers) are written as they are;
- jsonl: one JSON object per line, keys in column order, None as null, UTF-8;
- parquet (pyarrow): a fixed schema (strings and int64, all nullable), zstd level 3, no
  dictionary encoding, statistics on, format 2.6, data pages v1, row groups of 65,536 rows.
  Parquet's footer names the writing library's version (`created_by`), so files are
  byte-identical for the same pyarrow version.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, Protocol

Format = Literal["csv", "jsonl", "parquet"]
FORMATS: tuple[Format, ...] = ("csv", "jsonl", "parquet")
MEDIA_TYPES: dict[Format, str] = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson",
    "parquet": "application/vnd.apache.parquet",
}
Row = dict[str, str | int | None]
PARQUET_ROW_GROUP = 65_536


@dataclass(frozen=True, slots=True)
class Columns:
    """A file's columns in order, those of them holding integers, and those holding text a client
    chose (escaped in CSV; see the module doc)."""

    names: tuple[str, ...]
    ints: frozenset[str] = frozenset()
    client_text: frozenset[str] = frozenset()


class RowWriter(Protocol):
    def write(self, row: Row) -> None: ...

    def close(self) -> None:
        """Finish the file (the underlying stream stays open)."""


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def escape_formula(text: str) -> str:
    """`text` with a leading "'" when a spreadsheet would read it as a formula (see the module doc)."""
    return "'" + text if text.lstrip("'").startswith(FORMULA_STARTS) else text


def unescape_formula(text: str) -> str:
    """The inverse of `escape_formula`."""
    return text[1:] if text.startswith("'") and text.lstrip("'").startswith(FORMULA_STARTS) else text


def _csv_cell(value: str | int | None, is_client_text: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return str(value)
    text = escape_formula(value) if is_client_text else value
    return '"' + text.replace('"', '""') + '"' if _NEEDS_QUOTES.search(text) else text


class _LineWriter:
    """Each row as one line of bytes on `out` (`_line`), in the columns' order."""

    def __init__(self, out: BinaryIO, columns: Columns) -> None:
        self._out = out
        self._columns = columns.names

    def _line(self, row: Row) -> bytes:
        raise NotImplementedError

    def write(self, row: Row) -> None:
        self._out.write(self._line(row))

    def close(self) -> None:
        self._out.flush()


class CsvWriter(_LineWriter):
    def __init__(self, out: BinaryIO, columns: Columns) -> None:
        super().__init__(out, columns)
        self._escaped = tuple(c in columns.client_text for c in self._columns)
        self._out.write((",".join(_csv_cell(c, False) for c in self._columns) + "\n").encode())

    def _line(self, row: Row) -> bytes:
        cells = (_csv_cell(row[c], escaped) for c, escaped in zip(self._columns, self._escaped))
        return (",".join(cells) + "\n").encode()


class JsonlWriter(_LineWriter):
    def _line(self, row: Row) -> bytes:
        ordered = {c: row[c] for c in self._columns}
        return json.dumps(ordered, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class ParquetWriter:
    def __init__(self, out: BinaryIO, columns: Columns) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self._columns = columns.names
        fields = [pa.field(c, pa.int64() if c in columns.ints else pa.string(), nullable=True) for c in self._columns]
        self._schema = pa.schema(fields)
        self._writer = pq.ParquetWriter(
            out,
            self._schema,
            version="2.6",
            compression="zstd",
            compression_level=3,
            use_dictionary=False,
            write_statistics=True,
            data_page_version="1.0",
        )
        self._pending: list[Row] = []

    def write(self, row: Row) -> None:
        self._pending.append(row)
        if len(self._pending) >= PARQUET_ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        columns: dict[str, list[Any]] = {c: [r[c] for r in self._pending] for c in self._columns}
        self._writer.write_table(self._pa.table(columns, schema=self._schema), row_group_size=PARQUET_ROW_GROUP)
        self._pending = []

    def close(self) -> None:
        if self._pending:
            self._flush()
        self._writer.close()


def open_writer(fmt: Format, out: BinaryIO, columns: Columns) -> RowWriter:
    """A writer of `fmt` onto the binary stream `out`; call `close()` once every row is written."""
    if fmt == "csv":
        return CsvWriter(out, columns)
    if fmt == "jsonl":
        return JsonlWriter(out, columns)
    if fmt == "parquet":
        return ParquetWriter(out, columns)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _read_cell(name: str, text: str, columns: Columns) -> str | int | None:
    if text == "":
        return None
    if name in columns.ints:
        return int(text)
    return unescape_formula(text) if name in columns.client_text else text


def read_rows(fmt: Format, data: bytes, columns: Columns) -> list[Row]:
    """Read an export back into rows (for checks and tests): the inverse of the writers."""
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(data.decode(), newline=""))
        return [{k: _read_cell(k, v, columns) for k, v in row.items()} for row in reader]
    if fmt == "jsonl":
        return [json.loads(line) for line in data.decode().splitlines() if line]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        rows: list[dict[str, str | int | None]] = pq.read_table(io.BytesIO(data)).to_pylist()
        return rows
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
