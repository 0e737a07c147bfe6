"""The errors a caller of `RaftNode` sees (re-exported by `orchestrator.raft.node`).

The core raises its own (`types.ProposalDropped` and subclasses); the driver turns them into
these, adding what a caller needs to retry elsewhere (`NotLeader.leader_addr`).
"""

from __future__ import annotations

from orchestrator.raft.types import NodeId


class RaftError(Exception):
    """Base of the errors a caller of RaftNode sees."""


class NotLeader(RaftError):
    """This server cannot take the request; `leader` / `leader_addr` say who can (if known)."""

    def __init__(self, reason: str, leader: NodeId, leader_addr: str | None) -> None:
        super().__init__(f"{reason} (leader: {leader_addr or 'unknown'})")
        self.leader = leader
        self.leader_addr = leader_addr


class ProposalLost(RaftError):
    """The proposal's log entry was replaced by another leader's: it was NOT committed."""


class Busy(RaftError):
    """The leader cannot take this request right now (transfer or membership change under
    way); retry shortly."""


class InvalidRequest(RaftError):
    """A membership change or transfer that cannot succeed as asked."""


class OutcomeUnknown(RaftError):
    """The proposal may or may not have been committed (e.g. this server caught up by snapshot)."""


class ReadAborted(RaftError):
    """Leadership changed before the read point was confirmed; retry."""


class Deposed(RaftError):
    """A fenced proposal (`submit(..., fence_term=T)`) found this server no longer the leader
    of term T: it was neither appended nor forwarded. Not retryable in term T."""
