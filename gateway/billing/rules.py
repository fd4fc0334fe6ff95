"""Which tokens of a request are billed: the one rule metering and recomputation share.

- ok, cancelled: everything processed - the prompt (cached tokens at the cached rate) and every
  token generated, also those a client that went away never read;
- backend_error, rejected: nothing. The request failed on our side of the wire (a backend died,
  broke the stream or refused the request): before the first token there is nothing to bill, and
  after it the client holds a broken answer (a non-streaming client holds none at all). The
  record still keeps the raw token counts, for audit;
- cached: nothing. The answer came from the response cache (gateway/pipeline/answer_cache.py): no
  backend ran, and the record carries 0 tokens.
"""

from __future__ import annotations

from contracts.usage import Usage

FREE_STATUSES = ("backend_error", "rejected", "cached")


def billable_usage(status: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """The part of a request's raw token counts that is priced."""
    if status in FREE_STATUSES:
        return Usage(0, 0, 0)
    return Usage(prompt_tokens, completion_tokens, min(cached_tokens, prompt_tokens))
