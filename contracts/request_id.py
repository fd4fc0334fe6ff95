"""The request id that follows one request from the gateway into a backend's engine.

The gateway names every request (the ledger's key, `cf-ray`) and sends that id to the backend
in `x-request-id`; our backend makes it its engine request id (`cmpl-<id>`, `chatcmpl-<id>`),
so a gateway log line can be followed into the backend's. trtllm-serve, vLLM and SGLang ignore
the header harmlessly. Ids are short and plain, so they are safe in logs and headers.
"""

from __future__ import annotations

import re

REQUEST_ID_HEADER = "x-request-id"
PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

_VALID = re.compile(PATTERN)


def is_valid(value: str) -> bool:
    return _VALID.match(value) is not None
