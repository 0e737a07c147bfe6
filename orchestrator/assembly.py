"""What the server runs while it leads: the built-in controllers and the scheduler, wired here.

`default_controllers(ctx)` is the one list of them: add a new controller here. The server's
`ControllerManager` (built by `controller_manager`) calls it each time this server becomes the
Raft leader, with a fresh `ControllerContext` for that term (a fenced in-process client, a shared
informer factory, an event recorder); it returns the components to run until leadership is lost:
`Controller`s and any other `Component` (an `async run(*, task_status)`), such as the
`Scheduler`.

This module sits above the layers it wires, so that they need not know each other: the
controllers and the scheduler import only the controller runtime (never this module, the server
or each other), and `orchestrator.server` imports this module to assemble the process.
"""

from __future__ import annotations

from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.services import AllocationRepair
from orchestrator.controllers.daemonset import daemonset_controller
from orchestrator.controllers.deployment import deployment_controller
from orchestrator.controllers.endpoints import endpoints_controller
from orchestrator.controllers.endpointslice import endpointslice_controller
from orchestrator.controllers.gc import garbage_collector
from orchestrator.controllers.namespace import namespace_controller
from orchestrator.controllers.nodeipam import node_ipam_controller
from orchestrator.controllers.nodelifecycle import NodeLifecycleOptions, node_lifecycle_controllers
from orchestrator.controllers.replicaset import replicaset_controller
from orchestrator.controllers.runtime import (
    Component,
    ControllerContext,
    ControllerManager,
    ControllerOptions,
    Leadership,
)
from orchestrator.controllers.servicelb import servicelb_controller
from orchestrator.controllers.statefulset import statefulset_controller
from orchestrator.scheduler.scheduler import Scheduler

__all__ = ["controller_manager", "default_controllers"]


def default_controllers(ctx: ControllerContext) -> list[Component]:
    """The built-in controllers and the scheduler."""
    return [
        daemonset_controller(ctx),
        deployment_controller(ctx),
        replicaset_controller(ctx),
        statefulset_controller(ctx),
        Scheduler(ctx),
        garbage_collector(ctx),
        namespace_controller(ctx),
        *node_lifecycle_controllers(
            ctx,
            NodeLifecycleOptions(
                grace_period=ctx.options.node_monitor_grace_period,
                monitor_period=ctx.options.node_monitor_period,
            ),
        ),
        endpoints_controller(ctx),
        endpointslice_controller(ctx),
        servicelb_controller(ctx),
        node_ipam_controller(ctx),
        # The repair pass of the Services' ClusterIP and NodePort keys: it reads and writes the
        # store under the API (`apiserver.services`), its writes fenced to the term like the
        # controllers'.
        AllocationRepair(ctx.client.api.objects, fence_term=ctx.client.fence_term),
    ]


def controller_manager(
    api: Api, leadership: Leadership, options: ControllerOptions
) -> ControllerManager:
    """The server's controller manager: `default_controllers` against `api`, run while
    `leadership` (the server's Raft node) says this server leads, their writes fenced to the
    term."""
    return ControllerManager(api, default_controllers, leadership=leadership, options=options)
