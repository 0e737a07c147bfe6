"""The controller runtime: the project's client-go (and a little controller-runtime).

Everything a controller is built from, for the built-in controllers, the scheduler, the node
agent and users' own controllers (`examples/widget-controller/`). Import it from here, not from
the submodules: they are the implementation and may move.

* Talking to the API: `Client` (the protocol controllers program against), `InProcessClient`
  (calls the server's `Api` directly, still authorized, admitted and validated; optionally
  fenced to a Raft term) and `HttpClient` (HTTPS through `orchestrator.client.RestClient`);
  `WatchEvent`, `WatchStream`. Failures are `orchestrator.kube.errors.ApiError`.
* Caching: `SharedInformer` (list + watch into an indexed cache, with handlers),
  `InformerFactory` (one informer per resource, shared by every controller of a term), the
  index names (`NAMESPACE_INDEX`, `LABEL_INDEX`, `OWNER_INDEX`, `NODE_NAME_INDEX`) and key
  helpers: `object_key` (the work queue's key, "namespace/name" or "name"), `controller_of`,
  `deleted_object`, `DeletedFinalStateUnknown`.
* Reconciling: `Controller` (a work queue, workers and a `Reconciler`: `async def
  reconcile(key) -> Result`), `Result` (requeue, requeue_after), `TerminalError` (drop the key),
  `enqueue_owner`, `KeyFn`.
* Queues and retries: `WorkQueue` (client-go's contract: fair, stingy, dedup, add_after,
  add_rate_limited, forget, done, shutdown) over the pure `QueueCore`; `QueueShutDown`,
  `QueueStatistics`, `QueueObserver`; rate limiters as small composable objects
  (`ItemExponential`, `ItemFastSlow`, `TokenBucket`, `MaxOf`, `WithMaxWait`,
  `default_controller_rate_limiter`, the `RateLimiter` protocol).
* Events: `EventRecorder` (deduplicated, aggregated and rate-limited Kubernetes Events, by
  the pure `eventcorrelator.EventCorrelator`).
* Running: `ControllerManager` (runs a factory's controllers only while this server leads the
  Raft term, their writes fenced to it), `ControllerContext` (what a factory gets for one term),
  `ControllerOptions`, `Component` (anything with `async run(*, task_status)`),
  `ControllersFactory`, `Leadership`, `CONTROLLER_MANAGER_USER`.

So that a controller needs only this module, the face also re-exports what client-go's users
take from its neighbours: `ResourceInfo` (names a resource, as a GroupVersionResource),
`RestClient` and `load_kubeconfig` (the HTTPS transport under `HttpClient`, from
`orchestrator.client`), `ApiError` (every failure, `exc.code` 404, 409, ...) and `Obj` (an
object: a JSON dict). Metrics go to a registry of `orchestrator.metrics` (`REGISTRY` unless one
is given).

The names are loaded on first use (PEP 562 `__getattr__`), each from its submodule: an agent
that only speaks HTTPS imports the client and the events recorder, never the in-process client
and the manager (and through them the API server's layers and the PKI), which keeps the
standalone agent small. The `TYPE_CHECKING` block lists the same names for type checkers and
readers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.client.config import load_kubeconfig as load_kubeconfig
    from orchestrator.client.resource import ResourceInfo as ResourceInfo
    from orchestrator.client.rest import RestClient as RestClient
    from orchestrator.controllers.runtime.client import Client as Client
    from orchestrator.controllers.runtime.client import HttpClient as HttpClient
    from orchestrator.controllers.runtime.client import WatchEvent as WatchEvent
    from orchestrator.controllers.runtime.client import WatchStream as WatchStream
    from orchestrator.controllers.runtime.controller import Controller as Controller
    from orchestrator.controllers.runtime.controller import KeyFn as KeyFn
    from orchestrator.controllers.runtime.controller import Reconciler as Reconciler
    from orchestrator.controllers.runtime.controller import Result as Result
    from orchestrator.controllers.runtime.controller import TerminalError as TerminalError
    from orchestrator.controllers.runtime.controller import enqueue_owner as enqueue_owner
    from orchestrator.controllers.runtime.events import EventRecorder as EventRecorder
    from orchestrator.controllers.runtime.informer import LABEL_INDEX as LABEL_INDEX
    from orchestrator.controllers.runtime.informer import NAMESPACE_INDEX as NAMESPACE_INDEX
    from orchestrator.controllers.runtime.informer import NODE_NAME_INDEX as NODE_NAME_INDEX
    from orchestrator.controllers.runtime.informer import OWNER_INDEX as OWNER_INDEX
    from orchestrator.controllers.runtime.informer import (
        DeletedFinalStateUnknown as DeletedFinalStateUnknown,
    )
    from orchestrator.controllers.runtime.informer import InformerFactory as InformerFactory
    from orchestrator.controllers.runtime.informer import SharedInformer as SharedInformer
    from orchestrator.controllers.runtime.informer import controller_of as controller_of
    from orchestrator.controllers.runtime.informer import deleted_object as deleted_object
    from orchestrator.controllers.runtime.informer import object_key as object_key
    from orchestrator.controllers.runtime.informer import (
        strip_managed_fields as strip_managed_fields,
    )
    from orchestrator.controllers.runtime.inprocess import InProcessClient as InProcessClient
    from orchestrator.controllers.runtime.manager import (
        CONTROLLER_MANAGER_USER as CONTROLLER_MANAGER_USER,
    )
    from orchestrator.controllers.runtime.manager import Component as Component
    from orchestrator.controllers.runtime.manager import ControllerContext as ControllerContext
    from orchestrator.controllers.runtime.manager import ControllerManager as ControllerManager
    from orchestrator.controllers.runtime.manager import ControllerOptions as ControllerOptions
    from orchestrator.controllers.runtime.manager import (
        ControllersFactory as ControllersFactory,
    )
    from orchestrator.controllers.runtime.manager import Leadership as Leadership
    from orchestrator.controllers.runtime.ratelimit import ItemExponential as ItemExponential
    from orchestrator.controllers.runtime.ratelimit import ItemFastSlow as ItemFastSlow
    from orchestrator.controllers.runtime.ratelimit import MaxOf as MaxOf
    from orchestrator.controllers.runtime.ratelimit import RateLimiter as RateLimiter
    from orchestrator.controllers.runtime.ratelimit import TokenBucket as TokenBucket
    from orchestrator.controllers.runtime.ratelimit import WithMaxWait as WithMaxWait
    from orchestrator.controllers.runtime.ratelimit import (
        default_controller_rate_limiter as default_controller_rate_limiter,
    )
    from orchestrator.controllers.runtime.workqueue import QueueCore as QueueCore
    from orchestrator.controllers.runtime.workqueue import QueueObserver as QueueObserver
    from orchestrator.controllers.runtime.workqueue import QueueShutDown as QueueShutDown
    from orchestrator.controllers.runtime.workqueue import QueueStatistics as QueueStatistics
    from orchestrator.controllers.runtime.workqueue import WorkQueue as WorkQueue
    from orchestrator.kube.errors import ApiError as ApiError
    from orchestrator.kube.objects import Obj as Obj

_RUNTIME = "orchestrator.controllers.runtime."
_MODULE_OF: dict[str, str] = {
    "load_kubeconfig": "orchestrator.client.config",
    "ResourceInfo": "orchestrator.client.resource",
    "RestClient": "orchestrator.client.rest",
    "ApiError": "orchestrator.kube.errors",
    "Obj": "orchestrator.kube.objects",
    **dict.fromkeys(("Client", "HttpClient", "WatchEvent", "WatchStream"), _RUNTIME + "client"),
    **dict.fromkeys(
        ("Controller", "KeyFn", "Reconciler", "Result", "TerminalError", "enqueue_owner"),
        _RUNTIME + "controller",
    ),
    "EventRecorder": _RUNTIME + "events",
    **dict.fromkeys(
        (
            "LABEL_INDEX",
            "NAMESPACE_INDEX",
            "NODE_NAME_INDEX",
            "OWNER_INDEX",
            "DeletedFinalStateUnknown",
            "InformerFactory",
            "SharedInformer",
            "controller_of",
            "deleted_object",
            "object_key",
            "strip_managed_fields",
        ),
        _RUNTIME + "informer",
    ),
    "InProcessClient": _RUNTIME + "inprocess",
    **dict.fromkeys(
        (
            "CONTROLLER_MANAGER_USER",
            "Component",
            "ControllerContext",
            "ControllerManager",
            "ControllerOptions",
            "ControllersFactory",
            "Leadership",
        ),
        _RUNTIME + "manager",
    ),
    **dict.fromkeys(
        (
            "ItemExponential",
            "ItemFastSlow",
            "MaxOf",
            "RateLimiter",
            "TokenBucket",
            "WithMaxWait",
            "default_controller_rate_limiter",
        ),
        _RUNTIME + "ratelimit",
    ),
    **dict.fromkeys(
        ("QueueCore", "QueueObserver", "QueueShutDown", "QueueStatistics", "WorkQueue"),
        _RUNTIME + "workqueue",
    ),
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Load `name` from its module on first use, then keep it as a module attribute."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
