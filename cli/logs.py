"""Structured logging: one call at process start, JSON lines or console rendering."""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog


class _Stderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured.

    A file object bound at configure time outlives its stream wherever stderr is swapped
    (test runners' capture, daemonizing wrappers) and every later line fails on a closed file.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", json: bool = True) -> None:
    """Route structlog and stdlib logging (uvicorn, httpx) through one renderer on stderr."""
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # structlog asks for a TextIO but only calls write() and flush(), which _Stderr has
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processor=renderer))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
