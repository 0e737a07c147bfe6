"""Controller runtime: what every controller is built on.

The work queue (client-go's contract: fair, stingy, delays, rate-limited retries, shutdown), its
composable rate limiters and a small Prometheus metrics registry.
"""

from .metrics import REGISTRY as REGISTRY
from .metrics import Counter as Counter
from .metrics import Gauge as Gauge
from .metrics import Histogram as Histogram
from .metrics import Registry as Registry
from .ratelimit import ItemExponential as ItemExponential
from .ratelimit import ItemFastSlow as ItemFastSlow
from .ratelimit import MaxOf as MaxOf
from .ratelimit import RateLimiter as RateLimiter
from .ratelimit import TokenBucket as TokenBucket
from .ratelimit import WithMaxWait as WithMaxWait
from .ratelimit import default_controller_rate_limiter as default_controller_rate_limiter
from .workqueue import QueueCore as QueueCore
from .workqueue import QueueShutDown as QueueShutDown
from .workqueue import QueueStatistics as QueueStatistics
from .workqueue import WorkQueue as WorkQueue
