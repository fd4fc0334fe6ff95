"""A `multipart/form-data` body -> its fields (name -> bytes), with the standard library's MIME parser.

Only what the finetunes API reads (a file and a few text fields); Starlette's own form parser needs the
python-multipart package, which the gateway does not otherwise depend on.
"""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

from gateway.errors import InvalidInput


def form_fields(content_type: str | None, body: bytes) -> dict[str, bytes]:
    """The body's parts by their form name; InvalidInput when it is not multipart/form-data."""
    if content_type is None or not content_type.lower().startswith("multipart/form-data"):
        raise InvalidInput("send the file as multipart/form-data (curl -F 'file=@adapter_model.safetensors' "
                           "-F file_name=adapter_model.safetensors)")
    message: Message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") +
                                                           b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise InvalidInput("the multipart body has no parts (is its boundary right?)")
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():  # type: ignore[attr-defined]
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = payload if isinstance(payload, bytes) else b""
    return fields
