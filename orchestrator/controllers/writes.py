"""Write patterns the controllers share, so each is written (and fixed) once.

* `update_retrying`: read-modify-write of one object, retried on conflicts. GET the live object,
  let `change` edit it in place (False: nothing to change), PUT it conditional on the
  resourceVersion it was read at; a 409 means someone wrote in between, so read again. Used by
  the garbage collector (owner references, finalizers), the namespace controller (finalizer,
  conditions) and the node lifecycle controller (conditions, taints). Gone (404, or another
  uid when one is given) is not an error: there is nothing left to change.
* `finish_sync`: the end of a workload sync (DaemonSet, StatefulSet): patch `/status` when the
  computed status differs from the cached one (a 404 means the object went away meanwhile),
  then raise the first error of the sync's creates and deletes (the runtime retries with
  backoff), else requeue after `requeue_after` when set.

Invariant: every write here is conditional (resourceVersion on updates) or idempotent (a merge
patch of the whole computed status), so a decision made on a stale read fails or converges
instead of overwriting a newer object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.client import ResourceInfo
from orchestrator.controllers.runtime.client import Client
from orchestrator.controllers.runtime.controller import Result
from orchestrator.kube.errors import ApiError
from orchestrator.kube.objects import Obj

__all__ = ["UPDATE_ATTEMPTS", "finish_sync", "status_differs", "update_retrying"]

UPDATE_ATTEMPTS = 5  # conflicts before a read-modify-write gives up (and the sync is retried)


async def update_retrying(
    client: Client,
    res: ResourceInfo,
    name: str,
    change: Callable[[Obj], bool],
    namespace: str = "",
    *,
    subresource: str = "",
    uid: str | None = None,
    attempts: int = UPDATE_ATTEMPTS,
) -> Obj | None:
    """Read-modify-write `res` `namespace/name` (see the module doc). Returns the object as
    written, or as read when `change` found nothing to do; None when it is gone (404, or its
    uid is not `uid`). Raises a 409 `ApiError` after `attempts` conflicts in a row."""
    for _ in range(attempts):
        try:
            live = await client.get(res, name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        if uid is not None and (live.get("metadata") or {}).get("uid") != uid:
            return None
        if not change(live):
            return live
        try:
            return await client.update(res, live, subresource=subresource)
        except ApiError as exc:
            if exc.code == 404:
                return None
            if exc.code != 409:
                raise
    where = f"{namespace}/{name}" if namespace else name
    raise ApiError(409, "Conflict", f"{res.group_resource} {where}: too many conflicts")


def status_differs(have: Mapping[str, Any], want: Mapping[str, Any], *, absent: Any = None) -> bool:
    """Some field of `want` differs from `have` (a field `have` lacks reads as `absent`)."""
    return any(have.get(k, absent) != v for k, v in want.items())


async def finish_sync(
    client: Client,
    res: ResourceInfo,
    key: str,
    obj: Obj,
    status: Obj,
    errors: Sequence[BaseException],
    requeue_after: float | None,
    *,
    absent: Any = None,
) -> Result:
    """The end of a workload sync of `obj` (cache key `ns/name`; see the module doc)."""
    if status_differs(obj.get("status") or {}, status, absent=absent):
        ns, name = key.split("/", 1)
        try:
            await client.patch(res, name, {"status": status}, ns, subresource="status")
        except ApiError as exc:
            if exc.code != 404:
                raise
    if errors:
        raise errors[0]
    if requeue_after:
        return Result(requeue_after=requeue_after)
    return Result()
