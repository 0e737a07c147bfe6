"""Controllers: the reconcile loops that drive the cluster's actual state towards its desired state.

`runtime` holds the machinery they share (work queue, rate limiters, metrics).
"""
