"""Controller runtime: what every controller is built on.

The work queue (client-go's contract: fair, stingy, delays, rate-limited retries, shutdown), its
composable rate limiters and a small Prometheus metrics registry.
"""

from orchestrator.controllers.runtime.metrics import REGISTRY as REGISTRY
from orchestrator.controllers.runtime.metrics import Counter as Counter
from orchestrator.controllers.runtime.metrics import Gauge as Gauge
from orchestrator.controllers.runtime.metrics import Histogram as Histogram
from orchestrator.controllers.runtime.metrics import Registry as Registry
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
from orchestrator.controllers.runtime.workqueue import QueueShutDown as QueueShutDown
from orchestrator.controllers.runtime.workqueue import QueueStatistics as QueueStatistics
from orchestrator.controllers.runtime.workqueue import WorkQueue as WorkQueue
