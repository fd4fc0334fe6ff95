"""KV transfer errors.

    KVTransferError              anything that stopped a pull
    ├── FingerprintMismatch      the two backends' model / block size / dtype / layout differ
    ├── PinNotFound              the pin is unknown, expired or already pulled
    ├── TransferRefused          the exporter refused (bad credentials, bad request)
    └── TransferFailed           the exporter is unreachable, or the connection broke midway
"""

from __future__ import annotations


class KVTransferError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FingerprintMismatch(KVTransferError):
    pass


class PinNotFound(KVTransferError):
    pass


class TransferRefused(KVTransferError):
    pass


class TransferFailed(KVTransferError):
    pass
