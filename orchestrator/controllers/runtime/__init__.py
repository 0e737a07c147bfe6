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
* Events: `EventRecorder` (deduplicated, aggregated Kubernetes Events).
* Running: `ControllerManager` (runs a factory's controllers only while this server leads the
  Raft term, their writes fenced to it), `ControllerContext` (what a factory gets for one term),
  `ControllerOptions`, `Component` (anything with `async run(*, task_status)`),
  `ControllersFactory`, `Leadership`, `CONTROLLER_MANAGER_USER`.

Metrics go to a registry of `orchestrator.metrics` (`REGISTRY` unless one is given).

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

_SUBMODULE_OF: dict[str, str] = {
    **dict.fromkeys(("Client", "HttpClient", "WatchEvent", "WatchStream"), "client"),
    **dict.fromkeys(
        ("Controller", "KeyFn", "Reconciler", "Result", "TerminalError", "enqueue_owner"),
        "controller",
    ),
    "EventRecorder": "events",
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
        ),
        "informer",
    ),
    "InProcessClient": "inprocess",
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
        "manager",
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
        "ratelimit",
    ),
    **dict.fromkeys(
        ("QueueCore", "QueueObserver", "QueueShutDown", "QueueStatistics", "WorkQueue"),
        "workqueue",
    ),
}

__all__ = sorted(_SUBMODULE_OF)


def __getattr__(name: str) -> Any:
    """Load `name` from its submodule on first use, then keep it as a module attribute."""
    submodule = _SUBMODULE_OF.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
