"""Errors the gateway answers with: each carries its Workers AI code, HTTP status and OpenAI type.

    GatewayError
    ├── InvalidInput           5004  400  a field is missing, of the wrong type or out of range
    ├── IncompleteRequest      3003  400  no body, or a body that is not a JSON object
    ├── NoSuchModel            5007  400  the model id is not in the catalog
    ├── ModelNotFound          5007  404  GET .../ai/v1/models/{model}: no such model, or not this key's
    ├── AuthenticationFailed  10000  401  missing, unknown or revoked API key
    ├── AccountMismatch       10000  403  the key's tenant does not own the account in the URL
    ├── TenantForbidden       10000  403  a tenant's key asked for another tenant's figures (dashboard)
    ├── ModelNotAllowed        5018  403  the tenant or key may not use this model
    ├── RequestTimeout         3007  408  the backend did not answer in time
    ├── RequestTooLarge        3006  413  the body is over the configured limit
    ├── RateLimited            3040  429  the key's requests/tokens per minute are used up (Retry-After)
    ├── BudgetExhausted        3036  429  the tenant's monthly budget is spent
    ├── OutOfCapacity          3040  429  no backend could take the request (all down or overloaded,
    │                                     or this gateway's backend_max_connections are all open);
    │                                     `busy()`: one with options.rejectIfBusy could not start at once
    ├── ConcurrencyLimited     3040  429  the tenant's requests in flight are at its limit (Retry-After)
    ├── NoRoute                7000  404  no such path (405: the path exists, not with this method)
    ├── BatchNotFound          7003  404  no batch of this tenant has that request_id (or it expired)
    ├── InternalError          3043  500  a bug or an upstream answer we cannot interpret
    └── ServiceUnavailable     3043  503  the shared store (Redis) cannot be reached; retry later

Codes and statuses follow the public Workers AI error table
(https://developers.cloudflare.com/workers-ai/platform/errors/); 10000 is the Cloudflare API's
"Authentication error", 7000 its "No route for that URI" and 7003 its "Could not route to ...,
perhaps your object identifier is invalid?". 3043 has no row in that table: it
is the code edgerun uses for its own internal and temporary failures. Endpoints raise these; the
handlers registered in `gateway.http.app` render them.
"""

from __future__ import annotations

from typing import ClassVar


class GatewayError(Exception):
    code: ClassVar[int] = 3043
    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the offending request field, when there is one
        self.retry_after_s = retry_after_s


class InvalidInput(GatewayError):
    code, status, openai_type = 5004, 400, "invalid_request_error"


class IncompleteRequest(GatewayError):
    code, status, openai_type = 3003, 400, "invalid_request_error"


class NoSuchModel(GatewayError):
    code, status, openai_type = 5007, 400, "invalid_request_error"


class ModelNotFound(GatewayError):
    code, status, openai_type = 5007, 404, "invalid_request_error"


class AuthenticationFailed(GatewayError):
    code, status, openai_type = 10000, 401, "authentication_error"


class AccountMismatch(GatewayError):
    code, status, openai_type = 10000, 403, "permission_error"


class TenantForbidden(GatewayError):
    code, status, openai_type = 10000, 403, "permission_error"


class ModelNotAllowed(GatewayError):
    code, status, openai_type = 5018, 403, "permission_error"


class RequestTimeout(GatewayError):
    code, status, openai_type = 3007, 408, "timeout_error"


class RequestTooLarge(GatewayError):
    code, status, openai_type = 3006, 413, "invalid_request_error"


class RateLimited(GatewayError):
    code, status, openai_type = 3040, 429, "rate_limit_error"


class BudgetExhausted(GatewayError):
    code, status, openai_type = 3036, 429, "insufficient_quota"


class OutOfCapacity(GatewayError):
    code, status, openai_type = 3040, 429, "rate_limit_error"


class ConcurrencyLimited(GatewayError):
    code, status, openai_type = 3040, 429, "rate_limit_error"


BUSY_MESSAGE = "Capacity temporarily exceeded, please try again."  # Workers AI's words for rejectIfBusy


def busy(retry_after_s: float | None = None) -> OutOfCapacity:
    """The answer to a request with `options.rejectIfBusy` that could not start at once."""
    return OutOfCapacity(BUSY_MESSAGE, retry_after_s=retry_after_s or 1.0)


class InternalError(GatewayError):
    code, status, openai_type = 3043, 500, "server_error"


class ServiceUnavailable(GatewayError):
    code, status, openai_type = 3043, 503, "server_error"


class NoRoute(GatewayError):
    code, status, openai_type = 7000, 404, "not_found_error"


class BatchNotFound(GatewayError):
    code, status, openai_type = 7003, 404, "not_found_error"
