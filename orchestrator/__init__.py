"""An edge orchestrator: a Kubernetes-style declarative control plane in one trio process."""

__version__ = "0.1.0"
