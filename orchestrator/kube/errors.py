"""API errors as metav1.Status objects: the one way any part of the API server reports failure.

Every handler raises `ApiError` (or a helper below); the ASGI app turns it into a JSON Status
with `status: Failure`, the reason and code kubectl prints, and `details.causes` for field errors.
Nothing outside this module builds a failure Status by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Cause:
    """One field-level problem (metav1.StatusCause)."""

    field: str  # dotted path as Kubernetes prints it: "spec.replicas", "metadata.name"
    message: str
    reason: str = "FieldValueInvalid"  # FieldValueRequired, FieldValueNotSupported, ...

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class ApiError(Exception):
    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def _resource(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def bad_request(message: str, causes: list[Cause] | None = None) -> ApiError:
    details = {"causes": [c.to_dict() for c in causes]} if causes else {}
    return ApiError(400, "BadRequest", message, details)


def unauthorized(message: str = "Unauthorized") -> ApiError:
    return ApiError(401, "Unauthorized", message)


def forbidden(
    user: str, verb: str, resource: str, group: str, namespace: str, name: str = ""
) -> ApiError:
    what = f'{_resource(resource, group)} "{name}"' if name else _resource(resource, group)
    scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    message = (
        f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{group}"{scope}'
    )
    details: dict[str, Any] = {"kind": resource, "group": group}
    if name:
        details["name"] = name
    return ApiError(403, "Forbidden", message, details)


def not_found(resource: str, group: str, name: str) -> ApiError:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(404, "NotFound", f'{_resource(resource, group)} "{name}" not found', details)


def route_not_found() -> ApiError:
    return ApiError(
        404,
        "NotFound",
        "the server could not find the requested resource",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(
        409, "AlreadyExists", f'{_resource(resource, group)} "{name}" already exists', details
    )


_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
PATCH_TYPES = (
    "application/json-patch+json, application/merge-patch+json, "
    "application/apply-patch+yaml, application/strategic-merge-patch+json"
)


def conflict(resource: str, group: str, name: str, why: str = "") -> ApiError:
    why = why or _MODIFIED
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_resource(resource, group)} "{name}": {why}',
        details,
    )


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """422: `Deployment.apps "x" is invalid: spec.replicas: Invalid value: -1: must be ...`."""
    what = f"{kind}.{group}" if group else kind
    listed = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
    if len(causes) > 1:
        listed = (
            "["
            + ", ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
            + "]"
        )
    details: dict[str, Any] = {"name": name, "kind": kind, "causes": [c.to_dict() for c in causes]}
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{what} "{name}" is invalid: {listed}', details)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: str = PATCH_TYPES) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f'{accepted}; got "{content_type}"',
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_large(message: str = "the request entity is too large") -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", message)


def service_unavailable(message: str) -> ApiError:
    return ApiError(503, "ServiceUnavailable", message)


def too_many_requests(retry_after: int, message: str = "") -> ApiError:
    """429, as API Priority and Fairness refuses: the Status says when to retry
    (`details.retryAfterSeconds`) and so does the `Retry-After` header."""
    return ApiError(
        429,
        "TooManyRequests",
        message or "Too many requests, please try again later.",
        {"retryAfterSeconds": retry_after},
        {"Retry-After": str(retry_after)},
    )


def retry_after(exc: ApiError) -> float | None:
    """The seconds a failure asks the caller to wait before retrying (its `Retry-After`
    header, else `details.retryAfterSeconds`), or None when it names none."""
    for value in (exc.headers.get("Retry-After"), exc.details.get("retryAfterSeconds")):
        try:
            seconds = float(value) if value is not None else None
        except (TypeError, ValueError):
            continue
        if seconds is not None and seconds >= 0 and seconds == seconds:  # not NaN
            return min(seconds, 3600.0)
    return None


def timeout(message: str) -> ApiError:
    return ApiError(504, "Timeout", message)


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", message)
