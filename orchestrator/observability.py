"""The process's Prometheus metric families (process, Raft, store, API, agent) in `REGISTRY`.

Theory of operation
-------------------
Every family is created once, at import, in the process-wide registry of
`controllers.runtime.metrics` (which `/metrics` renders; the controller runtime's work queue
families live there too). Hot paths only touch what they must: a counter `inc` or a histogram
`observe` on a child they looked up once. Values that already exist elsewhere are not copied
on every change but read when `/metrics` is rendered (`set_function`):

* process — `/proc/self/stat`, `/proc/self/statm`, `/proc/self/fd`, like the Go and Python
  clients' process collectors (CPU seconds, resident and virtual memory, open and max fds,
  start time);
* Raft — term, commit and applied index, leadership of the node `bind_raft_node` was given;
* store — revision, compact revision, compactions, database and WAL file sizes of the MVCC
  store `bind_store` was given.

One process normally runs one Raft server; tests may run several in one process, and then the
gauges bound last win (they hold their node through a weak reference, so a finished node is
never kept alive by the registry, and a gone one reads as 0).

Names follow etcd and Kubernetes where there is an equivalent: `raft_wal_fsync_duration_seconds`
is etcd's `etcd_disk_wal_fsync_duration_seconds` (one Raft storage transaction, fsync
included), `raft_commit_duration_seconds` the time from a proposal's append on the leader to its
apply there, `apiserver_request_total{verb,resource,code}` and
`apiserver_request_duration_seconds{verb,resource}` kube-apiserver's (verbs LIST, GET, WATCH,
POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION, or the HTTP method for non-resource paths;
`resource` is `pods`, `pods/status`, ... and empty for non-resource paths),
`agent_pod_start_duration_seconds` kubelet's `kubelet_pod_start_duration_seconds` and
`agent_cri_call_duration_seconds{method}` kubelet's `kubelet_runtime_operations_duration_seconds`.
`certificate_expiration_timestamp_seconds{cert}` is the expiry of each certificate in use (set by
`security.renewal` whenever it reads the files; alert on `... - time() < 30 * 86400`).
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.metrics import REGISTRY, Histogram, HistogramChild

if TYPE_CHECKING:
    from orchestrator.store.mvcc import MVCCStore

__all__ = [
    "API_REQUESTS",
    "API_REQUEST_DURATION",
    "API_WATCHERS",
    "CERT_EXPIRATION",
    "CRI_CALL_DURATION",
    "POD_START_DURATION",
    "RAFT_COMMIT_DURATION",
    "RAFT_LEADER_CHANGES",
    "RAFT_PROPOSALS_FAILED",
    "RAFT_TICK_LATENESS",
    "RAFT_WAL_FSYNC_DURATION",
    "ApiRequestMetrics",
    "TimedRuntime",
    "bind_raft_node",
    "bind_store",
]

# etcd's disk histograms: ExponentialBuckets(0.001, 2, 14), 1 ms ... 8 s.
DISK_BUCKETS = tuple(0.001 * 2**i for i in range(14))
# kube-apiserver's request duration buckets (seconds).
API_BUCKETS = (
    0.005,
    0.025,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    1.25,
    1.5,
    2.0,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
)
# kubelet's pod start buckets (seconds): 0.5 s ... 30 min.
POD_START_BUCKETS = (0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 600, 1800)
# kubelet's runtime operation buckets: 5 ms ... 5 min.
CRI_BUCKETS = (*(0.005 * 2.5**i for i in range(12)), 300.0)


# ---------------------------------------------------------------------------------- process
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat_fields() -> list[str]:
    """/proc/self/stat after the command name (field 3 onwards); [] off Linux."""
    try:
        with open("/proc/self/stat", "rb") as f:
            data = f.read().decode()
    except OSError:
        return []
    return data[data.rfind(")") + 2 :].split()


def _cpu_seconds() -> float:
    fields = _stat_fields()
    if fields:  # utime, stime: fields 14 and 15 (index 11, 12 after the name)
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return time.process_time()


def _statm(index: int) -> float:
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[index]) * _PAGE_SIZE)
    except (OSError, IndexError, ValueError):
        return 0.0


def _open_fds() -> float:
    try:
        return float(len(os.listdir("/proc/self/fd")))
    except OSError:
        return 0.0


def _max_fds() -> float:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return float(soft) if soft != resource.RLIM_INFINITY else float("inf")
    except (ImportError, OSError, ValueError):
        return 0.0


@functools.cache
def _start_time() -> float:
    """Seconds since the epoch at which this process started (boot time + start ticks)."""
    fields = _stat_fields()
    try:
        with open("/proc/stat", "rb") as f:
            btime = next(
                int(line.split()[1])
                for line in f.read().decode().splitlines()
                if line[:6] == "btime "
            )
        return btime + int(fields[19]) / _CLOCK_TICKS  # starttime: field 22
    except (OSError, StopIteration, IndexError, ValueError):
        return _IMPORT_TIME


_IMPORT_TIME = time.time()

REGISTRY.counter(
    "process_cpu_seconds_total", "Total user and system CPU time spent in seconds."
).set_function(_cpu_seconds)
REGISTRY.gauge("process_resident_memory_bytes", "Resident memory size in bytes.").set_function(
    functools.partial(_statm, 1)
)
REGISTRY.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.").set_function(
    functools.partial(_statm, 0)
)
REGISTRY.gauge("process_open_fds", "Number of open file descriptors.").set_function(_open_fds)
REGISTRY.gauge("process_max_fds", "Maximum number of open file descriptors.").set_function(_max_fds)
REGISTRY.gauge(
    "process_start_time_seconds", "Start time of the process since unix epoch in seconds."
).set_function(_start_time)


# ---------------------------------------------------------------------------------- Raft
RAFT_COMMIT_DURATION = REGISTRY.histogram(
    "raft_commit_duration_seconds",
    "Time from appending a proposal on the leader to applying it there.",
    buckets=DISK_BUCKETS,
).labels()
RAFT_WAL_FSYNC_DURATION = REGISTRY.histogram(
    "raft_wal_fsync_duration_seconds",
    "Latency of persisting one Raft Ready batch (log entries and hard state, fsynced): "
    "etcd's etcd_disk_wal_fsync_duration_seconds.",
    buckets=DISK_BUCKETS,
).labels()
RAFT_TICK_LATENESS = REGISTRY.histogram(
    "raft_tick_lateness_seconds",
    "How long after its due time each Raft tick reached the Raft core: the Raft loop's delay "
    "behind its own disk work or other tasks holding the event loop. Elections and heartbeats "
    "slip by as much.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
).labels()
RAFT_LEADER_CHANGES = REGISTRY.counter(
    "raft_leader_changes_total", "Number of leader changes seen by this server."
).labels()
RAFT_PROPOSALS_FAILED = REGISTRY.counter(
    "raft_proposals_failed_total",
    "Proposals that failed: refused (no leader, busy, fenced), overwritten by another "
    "leader, timed out waiting for a quorum, or of unknown outcome after a snapshot.",
).labels()
_RAFT_IS_LEADER = REGISTRY.gauge("raft_is_leader", "1 if this server is the Raft leader, else 0.")
_RAFT_TERM = REGISTRY.gauge("raft_term", "The current Raft term of this server.")
_RAFT_COMMIT = REGISTRY.gauge("raft_commit_index", "The highest log index known committed.")
_RAFT_APPLIED = REGISTRY.gauge("raft_applied_index", "The highest log index applied here.")
_RAFT_LOG_DB = REGISTRY.gauge(
    "raft_storage_size_bytes", "Size of the Raft log database and its WAL (at the last snapshot)."
)


def _via(ref: Callable[[], Any], read: Callable[[Any], float]) -> Callable[[], float]:
    def value() -> float:
        obj = ref()
        if obj is None:
            return 0.0
        try:
            return float(read(obj))
        except (AttributeError, OSError, ValueError):  # not started yet, or closed
            return 0.0

    return value


class RaftGaugeSource(Protocol):
    """What the Raft gauges read (a `RaftNode`; a Protocol so that this module, which the
    node imports for its metric families, does not import the node)."""

    @property
    def is_leader(self) -> bool: ...

    def leadership(self) -> tuple[bool, int]: ...

    def commit_index(self) -> int: ...

    def applied_index(self) -> int: ...

    def storage_bytes(self) -> int: ...


def bind_raft_node(node: RaftGaugeSource) -> None:
    """Make the Raft gauges read `node` (call once its core exists)."""
    ref = weakref.ref(node)
    _RAFT_IS_LEADER.set_function(_via(ref, lambda n: 1.0 if n.is_leader else 0.0))
    _RAFT_TERM.set_function(_via(ref, lambda n: n.leadership()[1]))
    _RAFT_COMMIT.set_function(_via(ref, lambda n: n.commit_index()))
    _RAFT_APPLIED.set_function(_via(ref, lambda n: n.applied_index()))
    _RAFT_LOG_DB.set_function(_via(ref, lambda n: n.storage_bytes()))


# ---------------------------------------------------------------------------------- store
_STORE_DB = REGISTRY.gauge("store_db_size_bytes", "Size of the store's database file in bytes.")
_STORE_WAL = REGISTRY.gauge("store_wal_size_bytes", "Size of the store's SQLite WAL in bytes.")
_STORE_REV = REGISTRY.gauge("store_revision", "The store's current revision.")
_STORE_COMPACT_REV = REGISTRY.gauge(
    "store_compact_revision", "The revision up to which history is compacted."
)
_STORE_COMPACTIONS = REGISTRY.counter(
    "store_compactions_total", "Compactions applied to this server's store since it started."
)
_STORE_LOGICAL = REGISTRY.gauge(
    "store_logical_bytes", "The store's size as the quota counts it (keys, values, history)."
)


def _file_size(path: str) -> float:
    try:
        return float(os.path.getsize(path))
    except OSError:
        return 0.0


def bind_store(store: MVCCStore) -> None:
    """Make the store gauges read `store` (revision, compaction, file sizes)."""
    ref = weakref.ref(store)
    _STORE_REV.set_function(_via(ref, lambda s: s.revision()))
    _STORE_COMPACT_REV.set_function(_via(ref, lambda s: s.compact_revision()))
    _STORE_COMPACTIONS.set_function(_via(ref, lambda s: s.compactions))
    _STORE_LOGICAL.set_function(_via(ref, lambda s: s.logical_bytes()))
    _STORE_DB.set_function(_via(ref, lambda s: _file_size(s.path)))
    _STORE_WAL.set_function(_via(ref, lambda s: _file_size(s.path + "-wal")))


# ---------------------------------------------------------------------------------- API
API_REQUESTS = REGISTRY.counter(
    "apiserver_request_total",
    "Counter of apiserver requests broken out for each verb, resource and HTTP response code.",
    ["verb", "resource", "code"],
)
API_REQUEST_DURATION = REGISTRY.histogram(
    "apiserver_request_duration_seconds",
    "Response latency distribution in seconds for each verb and resource (for streams such as "
    "watches and logs: until the response starts).",
    ["verb", "resource"],
    API_BUCKETS,
)
API_WATCHERS = REGISTRY.gauge(
    "apiserver_registered_watchers", "Number of currently open watches per resource.", ["resource"]
)

_HTTP_VERBS = {"get": "GET", "list": "LIST", "watch": "WATCH", "create": "POST"}
_HTTP_VERBS |= {"update": "PUT", "patch": "PATCH", "delete": "DELETE"}
_HTTP_VERBS |= {"deletecollection": "DELETECOLLECTION"}


def api_verb(verb: str, content_type: str = "") -> str:
    """kube-apiserver's reported verb for a request verb (`apply` patches are APPLY)."""
    if verb == "patch" and content_type.startswith("application/apply-patch"):
        return "APPLY"
    return _HTTP_VERBS.get(verb) or verb.upper()


class ApiRequestMetrics:
    """The children of the API families, looked up once per (verb, resource[, code])."""

    def __init__(self) -> None:
        self._durations: dict[tuple[str, str], HistogramChild] = {}
        self._counts: dict[tuple[str, str, int], Any] = {}

    def observe(self, verb: str, resource: str, code: int, seconds: float) -> None:
        counter = self._counts.get((verb, resource, code))
        if counter is None:
            counter = self._counts[verb, resource, code] = API_REQUESTS.labels(
                verb, resource, str(code)
            )
        counter.inc()
        hist = self._durations.get((verb, resource))
        if hist is None:
            hist = self._durations[verb, resource] = API_REQUEST_DURATION.labels(verb, resource)
        hist.observe(seconds)


# ---------------------------------------------------------------------------------- certificates
CERT_EXPIRATION = REGISTRY.gauge(
    "certificate_expiration_timestamp_seconds",
    "Expiry (unix time) of a certificate this process serves or dials with: cert=ca, apiserver, "
    "apiserver-kubelet-client, kubelet (renewed automatically within 120 days, 30 for kubelet).",
    ["cert"],
)

# ---------------------------------------------------------------------------------- agent
POD_START_DURATION = REGISTRY.histogram(
    "agent_pod_start_duration_seconds",
    "Duration in seconds from the agent seeing a pod for the first time to the pod running.",
    buckets=POD_START_BUCKETS,
).labels()
CRI_CALL_DURATION: Histogram = REGISTRY.histogram(
    "agent_cri_call_duration_seconds",
    "Duration in seconds of container runtime (CRI) calls, by method.",
    ["method"],
    CRI_BUCKETS,
)


class TimedRuntime:
    """A container runtime whose coroutine methods observe `agent_cri_call_duration_seconds`
    (failed calls too); every other attribute is the wrapped runtime's."""

    def __init__(self, runtime: Any) -> None:
        self.wrapped = runtime

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.wrapped, name)
        if name.startswith("_") or name == "aclose" or not _is_coroutine_function(target):
            return target
        child = CRI_CALL_DURATION.labels(name)

        @functools.wraps(target)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await target(*args, **kwargs)
            finally:
                child.observe(time.perf_counter() - start)

        setattr(self, name, timed)  # looked up once per method
        return timed


def _is_coroutine_function(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)
