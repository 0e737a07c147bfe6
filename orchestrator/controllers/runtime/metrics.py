"""The work queue's metric families, in client-go's names (the registry is `orchestrator.metrics`).

`WorkqueueMetrics` follows k8s.io/component-base/metrics/prometheus/workqueue: depth, adds,
queue and work duration histograms, retries, unfinished work and longest running processor, all
labelled `name` (the queue's). Every queue of one registry shares the same families.
"""

from __future__ import annotations

from orchestrator.metrics import Registry

__all__ = ["WORKQUEUE_DURATION_BUCKETS", "WorkqueueMetrics"]

WORKQUEUE_DURATION_BUCKETS: tuple[float, ...] = tuple(10.0**e for e in range(-8, 2))
"""client-go's `ExponentialBuckets(10e-9, 10, 10)`: 10 ns … 10 s, for queue and work durations."""


class WorkqueueMetrics:
    """client-go's work queue metric families in one registry, all labelled `name` (the queue's)."""

    def __init__(self, registry: Registry) -> None:
        self.depth = registry.gauge("workqueue_depth", "Current depth of workqueue", ["name"])
        self.adds = registry.counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", ["name"]
        )
        self.queue_duration = registry.histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            ["name"],
            WORKQUEUE_DURATION_BUCKETS,
        )
        self.work_duration = registry.histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            ["name"],
            WORKQUEUE_DURATION_BUCKETS,
        )
        self.unfinished_work = registry.gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads. One can deduce the number of "
            "stuck threads by observing the rate at which this increases.",
            ["name"],
        )
        self.longest_running = registry.gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            ["name"],
        )
        self.retries = registry.counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue", ["name"]
        )
