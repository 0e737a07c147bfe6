"""What the Kubernetes REST API speaks, without a transport: content types, the `ApiException`
a metav1.Status becomes, and the sans-IO `WatchDecoder` of watch streams.

Split from `rest` (httpx) so that code which only needs these values — the server's in-process
clients, the controllers — does not import an HTTP client library; `rest` re-exports them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "APPLY_PATCH",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "TABLE_ACCEPT",
    "ApiConnectionError",
    "ApiException",
    "WatchDecoder",
    "WatchEvent",
]

JSON = "application/json"
TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

WatchEvent = tuple[str, dict[str, Any]]  # ("ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK", obj)


class ApiException(Exception):
    """The server answered with an error (a metav1.Status, or at least an HTTP status).

    `retry_after`: the seconds the server asked the client to wait before retrying (a 429's
    or 503's `Retry-After` header, else the Status' `details.retryAfterSeconds`), or None."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        status_body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.status_body = status_body
        self.retry_after = (
            retry_after
            if retry_after is not None
            else _seconds(self.details.get("retryAfterSeconds"))
        )

    @property
    def details(self) -> dict[str, Any]:
        d = (self.status_body or {}).get("details")
        return d if isinstance(d, dict) else {}

    @classmethod
    def from_status(cls, status: Mapping[str, Any], http_code: int = 0) -> ApiException:
        code = status.get("code")
        code = code if isinstance(code, int) and code else http_code
        reason = str(status.get("reason") or _reason_for(code))
        message = str(status.get("message") or reason)
        return cls(code, reason, message, dict(status))

    @classmethod
    def from_response(
        cls, code: int, body: bytes, phrase: str = "", retry_after_header: str | None = None
    ) -> ApiException:
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            exc = cls.from_status(doc, code)
        else:
            text = body.decode("utf-8", "replace").strip()
            reason = _reason_for(code) if code in _REASONS else (phrase or f"HTTP {code}")
            exc = cls(code, reason, text or phrase or reason, None)
        header = _seconds(retry_after_header)
        if header is not None:
            exc.retry_after = header
        return exc


class ApiConnectionError(Exception):
    """The API server could not be reached or the connection broke."""


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _reason_for(code: int) -> str:
    return _REASONS.get(code, "Unknown")


def _seconds(value: Any) -> float | None:
    """A Retry-After in seconds (an HTTP date is not understood: None), at most an hour."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return min(seconds, 3600.0) if seconds >= 0 else None


@dataclass
class WatchDecoder:
    """Sans-IO framing of a watch stream: bytes in, `(type, object)` events out.

    One JSON object per line; blank lines are skipped; a partial line waits for more data.
    An `ERROR` event raises `ApiException` from its Status object.
    """

    _buf: bytearray = field(default_factory=bytearray)

    def receive_data(self, data: bytes) -> list[WatchEvent]:
        self._buf += data
        out: list[WatchEvent] = []
        while (i := self._buf.find(b"\n")) >= 0:
            line = bytes(self._buf[:i]).strip()
            del self._buf[: i + 1]
            if line:
                out.append(self._event(line))
        return out

    def close(self) -> list[WatchEvent]:
        """The stream ended: a last line without its newline still counts."""
        line = bytes(self._buf).strip()
        self._buf.clear()
        return [self._event(line)] if line else []

    @staticmethod
    def _event(line: bytes) -> WatchEvent:
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise ApiException(500, "InternalError", f"bad watch line: {line[:200]!r}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("object"), dict):
            raise ApiException(500, "InternalError", f"bad watch event: {line[:200]!r}")
        etype = str(doc.get("type", ""))
        if etype == "ERROR":
            raise ApiException.from_status(doc["object"], 500)
        return etype, doc["object"]
