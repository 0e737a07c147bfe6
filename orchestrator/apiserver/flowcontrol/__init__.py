"""API Priority and Fairness: the overload gate every API request passes (HTTP and in process).

`fairqueue` is the pure core (priority levels, seats, shuffle-sharded fair queues), `classify`
the policy (which flow schema and priority level a request belongs to), `gate` the trio driver
(`FlowControl.seat`) with the metrics. Raft traffic never passes it.
"""

from orchestrator.apiserver.flowcontrol.classify import DEFAULT_LEVELS, Route, classify
from orchestrator.apiserver.flowcontrol.fairqueue import LevelConfig, LevelStatistics
from orchestrator.apiserver.flowcontrol.gate import (
    DEFAULT_MAX_REQUESTS_INFLIGHT,
    FlowControl,
    FlowControlConfig,
)

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_MAX_REQUESTS_INFLIGHT",
    "FlowControl",
    "FlowControlConfig",
    "LevelConfig",
    "LevelStatistics",
    "Route",
    "classify",
]
