"""An edge orchestrator: a Kubernetes-style declarative control plane in one trio process."""

import sys

__version__ = "0.1.0"

# httpx's package imports its own command-line tool (`httpx._main`) whenever click is installed,
# loading click and pygments (about 2 MB resident, for good) — and without `rich` that import then
# fails anyway. Nothing here runs httpx's CLI, so it is marked absent before httpx is first
# imported: httpx then defines its stand-in `main` instead.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"
