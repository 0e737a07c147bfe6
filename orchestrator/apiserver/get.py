"""The read verbs: get and list (kube-apiserver's get.go), and the selection a list, a
deletecollection and a watch's initial state share.

A get or list with resourceVersion "0" (and no continue token) is served by a local,
possibly stale read, as the apiserver serves it from its watch cache; anything else reads
linearizably. A list honours `limit` and `continue` across pages of the store: the store's
pages are filtered by the selectors until `limit` objects matched or the store has no more,
so a page may hold fewer than `limit` objects only when it is the last. However long, a list
is read from the store in pages of at most `STORE_PAGE` keys at the first page's revision, and
decoded, filtered and presented between `TimeSlice` pauses (see `slices`): a list of many
objects never holds the event loop, or the store's database thread, for long. A list served
over HTTP (`list_json`, `list_table_json`) is encoded an object at a time as they are
selected, so a long list is held as its JSON bytes, not as decoded objects (see
`slices.ItemsEncoder`).
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.apiserver import tables
from orchestrator.apiserver.handler import Call, Handler
from orchestrator.apiserver.options import ListOptions
from orchestrator.apiserver.slices import ItemsEncoder, TimeSlice
from orchestrator.apiserver.storage import decode
from orchestrator.kube import errors
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema.kind import Kind
from orchestrator.kube.selectors import FieldSelector, LabelSelector, check_field_labels

STORE_PAGE = 500  # keys per store read of a list (see `select`)


async def get_object(
    h: Handler, call: Call, kind: Kind, ns: str, name: str, *, rv: str = ""
) -> Obj:
    h.check_namespace_arg(kind, ns)
    h.authorize(call, "get", kind, ns, name)
    obj = await h.objects.get(kind, ns, name, stale_ok=rv == "0")
    return h.present(kind, obj)


def check_list(h: Handler, call: Call, kind: Kind, ns: str) -> None:
    """The list verb's checks before any read: the route, then authorization."""
    if not kind.namespaced and ns:
        raise errors.route_not_found()
    h.authorize(call, "list", kind, ns)


async def list_items(
    h: Handler, call: Call, kind: Kind, ns: str, opts: ListOptions
) -> tuple[list[Obj], int, str | None]:
    """The list verb's objects, revision and continue token (as a List or a Table)."""
    check_list(h, call, kind, ns)
    return await select(h, kind, ns, opts)


def _list_body(kind: Kind, objs: list[Obj], revision: int, token: str | None) -> Obj:
    meta: Obj = {"resourceVersion": str(revision)}
    if token:
        meta["continue"] = token
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": objs,
    }


async def list_objects(h: Handler, call: Call, kind: Kind, ns: str, opts: ListOptions) -> Obj:
    objs, revision, token = await list_items(h, call, kind, ns, opts)
    return _list_body(kind, objs, revision, token)


async def list_json(h: Handler, call: Call, kind: Kind, ns: str, opts: ListOptions) -> list[bytes]:
    """`codec.dumps(list_objects(...))` in pieces, each object encoded as it is selected."""
    check_list(h, call, kind, ns)
    encoder = ItemsEncoder()
    revision, token = await select_each(h, kind, ns, opts, encoder.add)
    return encoder.finish(_list_body(kind, [], revision, token))


async def list_table_json(
    h: Handler, call: Call, kind: Kind, ns: str, opts: ListOptions, include_object: str
) -> list[bytes]:
    """The list as a Table (`tables.table`; `include_object` is the query's `includeObject`)
    in pieces, each row encoded as its object is selected; ages are as of the list's start."""
    check_list(h, call, kind, ns)
    try:
        include = tables.include_object(include_object)
        bad = None
    except errors.ApiError as exc:  # reported after the list's own errors, as before
        include, bad = "None", exc
    now = h.clock()
    cols = tables.columns_of(kind)
    encoder = ItemsEncoder()

    def add(obj: Obj) -> None:
        if bad is None:
            encoder.add(tables.row(cols, obj, now, include))

    revision, token = await select_each(h, kind, ns, opts, add)
    if bad is not None:
        raise bad
    body = tables.table(
        kind,
        [],
        now,
        resource_version=str(revision),
        continue_token=token,
        include=include,
    )
    return encoder.finish(body)


def matcher(kind: Kind, labels: LabelSelector, fields: FieldSelector) -> Callable[[Obj], bool]:
    """Whether an object of `kind` matches the selectors (400 for a field label `kind` lacks)."""
    check_field_labels(fields, set(kind.field_labels))

    def matches(obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if not labels.matches(meta.get("labels") or {}):
            return False

        def getter(label: str) -> str | None:
            if label == "metadata.name":
                return str(meta.get("name", ""))
            if label == "metadata.namespace":
                return str(meta.get("namespace", ""))
            fn = kind.field_labels.get(label)
            return fn(obj) if fn else None

        return fields.matches(getter)

    return matches


async def select(
    h: Handler, kind: Kind, ns: str, opts: ListOptions
) -> tuple[list[Obj], int, str | None]:
    """Matching objects, the list revision and a continue token (limit/continue honoured)."""
    out: list[Obj] = []
    revision, token = await select_each(h, kind, ns, opts, out.append)
    return out, revision, token


async def select_each(
    h: Handler, kind: Kind, ns: str, opts: ListOptions, each: Callable[[Obj], object]
) -> tuple[int, str | None]:
    """`select`, each matching object (presented) given to `each` as soon as it is decoded,
    between the pauses of one `TimeSlice`; the list revision and continue token."""
    matches = matcher(kind, opts.label_selector, opts.field_selector)
    limit = opts.limit
    token = opts.continue_token
    stale = opts.stale_ok()
    count = 0
    timeslice = TimeSlice()
    while True:
        # Never more than STORE_PAGE keys per read: the state machine's database thread (which
        # applies the Raft log too) is held for one page, and the pages after the first are
        # read at its revision (the continue token's), so the list is still one snapshot.
        page_limit = min(limit - count, STORE_PAGE) if limit else STORE_PAGE
        res = await h.objects.list_kvs(
            kind, ns, limit=page_limit, continue_token=token, stale_ok=stale
        )
        for kv in res.kvs:
            await timeslice.pause()
            obj = decode(kv)
            if matches(obj):
                each(h.present(kind, obj))
                count += 1
        token = res.continue_token
        if token is None or (limit and count >= limit):
            return res.revision, token
