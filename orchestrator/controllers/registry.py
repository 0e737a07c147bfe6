"""The controllers the server's `ControllerManager` runs: add new ones here, in one place.

`default_controllers(ctx)` is called each time this server becomes the Raft leader, with a
fresh `ControllerContext` for that term (a fenced in-process client, a shared informer factory,
an event recorder); it returns the controllers to run until leadership is lost: `Controller`s
and any other `Component` (an `async run(*, task_status)`), such as the `Scheduler`.
"""

from __future__ import annotations

from orchestrator.controllers.daemonset import daemonset_controller
from orchestrator.controllers.deployment import deployment_controller
from orchestrator.controllers.endpoints import endpoints_controller
from orchestrator.controllers.gc import garbage_collector
from orchestrator.controllers.namespace import namespace_controller
from orchestrator.controllers.nodelifecycle import NodeLifecycleOptions, node_lifecycle_controllers
from orchestrator.controllers.replicaset import replicaset_controller
from orchestrator.controllers.runtime.manager import Component, ControllerContext
from orchestrator.controllers.statefulset import statefulset_controller
from orchestrator.scheduler.scheduler import Scheduler

__all__ = ["default_controllers"]


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
    ]
