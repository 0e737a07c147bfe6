"""Typed list and watch options: parsed once from the query string at the HTTP edge, or built
directly by the in-process client; malformed values are 400s whatever the resource."""

from __future__ import annotations

import pytest

from orchestrator.apiserver.options import ListOptions, WatchOptions
from orchestrator.apiserver.request import Query
from orchestrator.kube.errors import ApiError
from orchestrator.kube.selectors import parse_field_selector, parse_label_selector


def test_list_options_parse_selectors_and_paging() -> None:
    q = Query("labelSelector=app%3Dweb%2Ctier&fieldSelector=spec.nodeName%3Dn1&limit=5&continue=t")
    opts = ListOptions.parse(q)
    assert opts.label_selector == parse_label_selector("app=web,tier")
    assert opts.field_selector == parse_field_selector("spec.nodeName=n1")
    assert (opts.limit, opts.continue_token, opts.resource_version) == (5, "t", "")
    assert not opts.everything()
    assert not opts.stale_ok()  # a continue token pins the snapshot


def test_list_options_defaults_select_everything() -> None:
    opts = ListOptions.parse(Query("resourceVersion=0"))
    assert opts == ListOptions(resource_version="0")
    assert opts.everything()
    assert opts.stale_ok()


@pytest.mark.parametrize(
    "query", ["limit=-1", "limit=x", "labelSelector=a%20in", "fieldSelector=nope"]
)
def test_malformed_list_options_are_bad_requests(query: str) -> None:
    with pytest.raises(ApiError) as info:
        ListOptions.parse(Query(query))
    assert info.value.code == 400


def test_watch_options_parse_and_initial_list() -> None:
    q = Query(
        "watch=1&labelSelector=app%3Dweb&resourceVersion=7&allowWatchBookmarks=true"
        "&sendInitialEvents=true&timeoutSeconds=30"
    )
    opts = WatchOptions.parse(q)
    assert opts.allow_bookmarks
    assert opts.send_initial_events
    assert (opts.resource_version, opts.timeout_seconds) == ("7", 30)
    initial = opts.initial_list()
    assert initial.label_selector == parse_label_selector("app=web")
    assert (initial.resource_version, initial.limit, initial.continue_token) == ("7", 0, None)


def test_malformed_watch_flag_is_a_bad_request() -> None:
    with pytest.raises(ApiError) as info:
        WatchOptions.parse(Query("allowWatchBookmarks=maybe"))
    assert info.value.code == 400
