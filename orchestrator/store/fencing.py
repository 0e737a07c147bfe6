"""Fencing: writes tagged with the Raft term of the leadership they were made under.

Controllers run only on the Raft leader (`orchestrator.controllers.runtime.manager`). A leader
can be deposed without knowing it yet (a partition), and even once it knows, its controllers
take a moment to be cancelled. Fencing makes their late writes fail instead of landing under
the next leader.

Mechanism. A task runs writes inside `with fenced(T):` (the in-process controller client does so
around each write, with the term the manager started its controllers in). The context variable
travels with the task through `Api` and `ObjectStore` to `RaftStore._write`, which submits the
command with `RaftNode.submit(..., fence_term=T)`. The Raft driver's loop then, in the same turn
in which it appends the batch, checks that this server is the leader AND its term is T; if not,
the write fails with `Deposed` -> `Fenced` (a 503 through the API) and is never forwarded to
another leader. A retry (after `NotLeader`, `Busy`, `ProposalLost`) re-checks the fence.

Guarantee. A write fenced to term T is committed only if its entry was appended by the leader
of term T (the entry carries term T) and then accepted by a majority in term T. Once a leader
of a later term T' has been elected, a majority has moved past T and rejects term-T appends, and
T' 's log holds only the term-T entries its voters had accepted before they left T; so no
fenced-T write appended after that point can ever commit (it fails with `ProposalLost`, or
`NoQuorum` at the quorum timeout while the old leader is cut off), and every fenced-T write
submitted after this server learned of a later term fails at once with `Fenced`. Writes that
reached a majority in term T before the new election may still commit — they happened while T
was the legitimate leadership. Unfenced writes (HTTP clients, the API server's own) behave as
before: a follower forwards them and they are retried across leader changes.

Nothing here changes the log format: the fence is checked when proposing, not when applying.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

from orchestrator.store.types import Unavailable

__all__ = ["Fenced", "current_fence", "fenced"]

_FENCE: ContextVar[int | None] = ContextVar("orchestrator_fence_term", default=None)


class Fenced(Unavailable):
    """A write fenced to a Raft term this server no longer leads: it was not made."""

    code = "fenced"


class fenced:  # lower case: used like a function, `with fenced(term):`
    """Fence the writes made in this block (by this task) to Raft term `term` (None: no-op).

    A class rather than a `contextmanager` generator: every controller write enters one, and
    the generator machinery cost several times more."""

    __slots__ = ("_term", "_token")

    def __init__(self, term: int | None) -> None:
        self._term = term
        self._token: Token[int | None] | None = None

    def __enter__(self) -> None:
        if self._term is not None:
            self._token = _FENCE.set(self._term)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _FENCE.reset(self._token)
            self._token = None


def current_fence() -> int | None:
    """The term writes of the current task are fenced to, if any."""
    return _FENCE.get()
