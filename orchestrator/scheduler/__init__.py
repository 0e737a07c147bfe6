"""The scheduler's pure core: pick a node for each pending pod, never overcommitting.

Code map (all synchronous, no I/O, time and randomness passed in):

* `quantity` — "500m", "128Mi", "1e3" → exact values; CPU in milli-cores, the rest in units.
* `info` — `PodInfo` (a pod parsed once) and `NodeInfo` (a node's facts and running totals).
* `cache` — `SchedulerCache`: nodes and the pods counted on them, including pods *assumed* on a
  node before the bind shows up in the watch (confirm / forget / expire after a TTL).
* `plugins` — the filter and score plugins (one module per family), their protocols, the defaults.
* `framework` — runs the plugins: `schedule_one(pod, cache, rng, now) -> Decision`.
* `queue` — `SchedulingQueue`: active (priority, FIFO), backoff (1 → 10 s), unschedulable
  (until a cluster event, at most 5 min).

A driver (informers plus the binding API) runs one loop::

    pod = queue.pop(now)                      # None: wait for an event or queue.next_deadline()
    decision = schedule_one(pod, cache, rng, now)
    if decision.node is None:                 # FailedScheduling event: decision.message
        queue.add_unschedulable(pod, now)
    else:
        cache.assume(decision.pod, decision.node, now)
        ...bind; on success queue.done(pod) and cache.finish_binding(pod, now);
        ...on failure cache.forget(pod) and queue.add_backoff(pod, now)

and feeds informer events: nodes → `cache.add_node/update_node/remove_node` (then
`queue.move_all_to_active_or_backoff(now)` when the node is new or `update_node` returned True);
pods with a node name → `cache.add_pod/update_pod/remove_pod` (a deleted one also moves the
queue) and `queue.delete`; pending pods → `queue.add` / `queue.delete`.
"""

from orchestrator.scheduler.cache import CacheStatistics, SchedulerCache
from orchestrator.scheduler.framework import (
    DEFAULT_FRAMEWORK,
    Decision,
    Framework,
    check_node,
    failure_message,
    num_feasible_nodes_to_find,
    schedule_one,
)
from orchestrator.scheduler.info import NodeInfo, PodInfo, pod_key
from orchestrator.scheduler.plugins import FilterPlugin, NodeFilter, ScorePlugin
from orchestrator.scheduler.quantity import parse_cpu_milli, parse_quantity, parse_value
from orchestrator.scheduler.queue import QueueStatistics, SchedulingQueue

__all__ = [
    "DEFAULT_FRAMEWORK",
    "CacheStatistics",
    "Decision",
    "FilterPlugin",
    "Framework",
    "NodeFilter",
    "NodeInfo",
    "PodInfo",
    "QueueStatistics",
    "SchedulerCache",
    "SchedulingQueue",
    "ScorePlugin",
    "check_node",
    "failure_message",
    "num_feasible_nodes_to_find",
    "parse_cpu_milli",
    "parse_quantity",
    "parse_value",
    "pod_key",
    "schedule_one",
]
