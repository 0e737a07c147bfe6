"""Typed request options (metav1.ListOptions, the watch's, and the write options), parsed once.

The HTTP edge (`app`) builds them from the query string with `parse`; the in-process client
(`controllers.runtime.inprocess`) builds them directly from its typed arguments; the verbs take
them typed and never see a query string. Selectors arrive parsed (`kube.selectors`), so nothing
parses a selector twice, and nothing encodes options back into a query string.

What is checked where: `parse` (and, for what the in-process client builds, the constructor)
refuses what is malformed whatever the resource (a selector's syntax, a non-integer or negative
limit, a boolean that is not one: 400s); what depends on the kind or the store (a field label
the kind does not support, a resourceVersion the store cannot serve) is the verb's business,
after authorization.

Invariants: the options are frozen; an empty selector is the "everything" one; a
`continue_token` is None or a non-empty token; `limit` is 0 (no limit) or positive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.apiserver.request import Query
from orchestrator.kube import errors
from orchestrator.kube.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)

__all__ = ["ListOptions", "WatchOptions", "WriteOptions"]


@dataclass(frozen=True, slots=True)
class ListOptions:
    """What a list (or a deletecollection, or a watch's initial list) selects.

    `resource_version`: "" (the latest, read linearizably) or "0" (any recent state: a local,
    possibly stale read, unless a continue token pins the snapshot); `resource_version_match`
    is carried for clients that send it (the store serves the latest or the given snapshot)."""

    label_selector: LabelSelector = field(default_factory=LabelSelector)
    field_selector: FieldSelector = field(default_factory=FieldSelector)
    limit: int = 0
    continue_token: str | None = None
    resource_version: str = ""
    resource_version_match: str = ""

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise errors.bad_request("limit must not be negative")

    @staticmethod
    def parse(query: Query) -> ListOptions:
        return ListOptions(
            label_selector=parse_label_selector(query.get("labelSelector")),
            field_selector=parse_field_selector(query.get("fieldSelector")),
            limit=query.number("limit", 0) or 0,
            continue_token=query.get("continue") or None,
            resource_version=query.get("resourceVersion"),
            resource_version_match=query.get("resourceVersionMatch"),
        )

    def everything(self) -> bool:
        """Whether the selectors select every object (no need to look at any)."""
        return self.label_selector.empty() and self.field_selector.empty()

    def stale_ok(self) -> bool:
        """Whether a local (possibly stale) read serves: resourceVersion "0", no continue."""
        return self.resource_version == "0" and self.continue_token is None


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """What a watch asks for (see `watch` for the semantics of each).

    `timeout_seconds`: when the server ends the stream (None: its own randomized default);
    the HTTP edge applies it, the in-process client keeps its own deadline."""

    label_selector: LabelSelector = field(default_factory=LabelSelector)
    field_selector: FieldSelector = field(default_factory=FieldSelector)
    resource_version: str = ""
    allow_bookmarks: bool = False
    send_initial_events: bool = False
    timeout_seconds: int | None = None

    @staticmethod
    def parse(query: Query) -> WatchOptions:
        return WatchOptions(
            label_selector=parse_label_selector(query.get("labelSelector")),
            field_selector=parse_field_selector(query.get("fieldSelector")),
            resource_version=query.get("resourceVersion"),
            allow_bookmarks=query.flag("allowWatchBookmarks"),
            send_initial_events=query.flag("sendInitialEvents"),
            timeout_seconds=query.number("timeoutSeconds"),
        )

    def everything(self) -> bool:
        return self.label_selector.empty() and self.field_selector.empty()

    def initial_list(self) -> ListOptions:
        """The list that gives the initial ADDED events: same selectors and resourceVersion."""
        return ListOptions(
            self.label_selector, self.field_selector, resource_version=self.resource_version
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    dry_run: bool
    field_manager: str
    field_validation: str  # Strict | Warn | Ignore
    force: bool = False

    @staticmethod
    def parse(query: Query, user_agent: str) -> WriteOptions:
        dry = query.get_all("dryRun")
        if any(d not in ("All", "") for d in dry):
            raise errors.bad_request(f"unsupported dryRun value {dry!r}: only 'All' is supported")
        validation = query.get("fieldValidation", "Warn") or "Warn"
        norm = {"strict": "Strict", "warn": "Warn", "ignore": "Ignore"}.get(validation.lower())
        if norm is None:
            raise errors.bad_request(
                f"fieldValidation must be Strict, Warn or Ignore, not {validation!r}"
            )
        manager = query.get("fieldManager")
        if len(manager) > 128:
            raise errors.bad_request("fieldManager must be at most 128 characters")
        if not manager:
            # As the apiserver does: the user agent's program name ("kubectl", ...).
            manager = user_agent.split("/", 1)[0][:128] or "unknown"
        return WriteOptions(bool(dry) and "All" in dry, manager, norm, query.flag("force"))
