"""`Obj`, the type of a Kubernetes object as the code handles it: its JSON shape as a dict.

One definition for every module (objects travel between the API server, the store's codec,
controllers, the scheduler and the agent unchanged).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Obj"]

Obj = dict[str, Any]
