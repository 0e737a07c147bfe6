"""Container runtime access for the node agent: the `RuntimeService` protocol, its dataclasses
and errors (see `runtime.py`), implemented by `containerd.CriRuntime` (CRI over gRPC) and
`simulated.SimulatedRuntime` (in memory). Import the implementations from their modules; this
package's namespace holds the contract only, so importing it never loads grpc.
"""

from orchestrator.cri import runtime as _runtime
from orchestrator.cri.runtime import *  # noqa: F403  (the contract is exactly runtime.__all__)

__all__ = _runtime.__all__
