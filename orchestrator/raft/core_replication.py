"""The Raft core's replication layer: sending the log (appends, snapshots, heartbeats),
receiving it as a follower, advancing the commit index, and ReadIndex.

This is the middle layer of `RaftCore` (see `core_state` for the layering). A leader tracks a
`Progress` per peer and sends appends, pipelined up to `max_inflight` per follower, or a
snapshot to a follower behind the log's compaction point; it commits the largest index a quorum
of voters holds, but only by counting replicas of an entry of its own term (§5.4.2).

ReadIndex: a read request records the commit index and is answered once a quorum of voters
acknowledged a heartbeat carrying its context (which confirms we were still leader when it was
made); a quorum's acknowledgement answers every earlier request too. Until the leader has
committed an entry of its own term it does not know the real commit index, so reads wait in
`pending_reads` until then.
"""

from __future__ import annotations

from orchestrator.raft.core_state import CoreState, ReadRequest
from orchestrator.raft.progress import Progress, ProgressState
from orchestrator.raft.types import (
    NONE,
    Entry,
    Message,
    MsgType,
    NodeId,
    ProposalDropped,
    ReadState,
    Role,
    Snapshot,
)


def quorum_index(matches: list[int]) -> int:
    """The largest index that a majority of `matches` have reached."""
    s = sorted(matches, reverse=True)
    return s[len(s) // 2]


class ReplicationCore(CoreState):
    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.committed:
            self._send(Message(MsgType.APP_RESP, m.frm, self.id, self.term, index=log.committed))
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(Message(MsgType.APP_RESP, m.frm, self.id, self.term, index=last_new))
            return
        hint = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
        self._send(
            Message(
                MsgType.APP_RESP,
                m.frm,
                self.id,
                self.term,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=log.term(hint) or 0,
            )
        )

    def _handle_snapshot(self, m: Message) -> None:
        s = m.snapshot
        if s is None:
            return
        meta = s.meta
        log = self.log
        if meta.index <= log.committed:
            pass  # stale: we already have everything it covers
        elif log.match_term(meta.index, meta.term):
            log.commit_to(meta.index)  # we hold that entry: just commit up to it
        else:
            log.restore(s)
            self.conf = meta.conf
            self._reset_prs()
            self.notes.append(f"installing snapshot at index {meta.index} term {meta.term}")
        self._send(Message(MsgType.APP_RESP, m.frm, self.id, self.term, index=log.last_index()))

    def _send_append(self, to: NodeId, allow_empty: bool = True) -> bool:
        pr = self.prs[to]
        if pr.is_paused():
            return False
        log = self.log
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None:
            if prev < log.offset:
                return self._send_snapshot(to, pr)
            prev = log.last_index()  # `next` ran past the log (after a truncation): re-probe
            pr.next, prev_term = prev + 1, log.last_term()
        ents = log.slice(pr.next, log.last_index() + 1, self.cfg.max_msg_bytes)
        if not ents and not allow_empty:
            return False
        if not ents and pr.state is ProgressState.REPLICATE and prev == pr.match:
            # The follower acknowledged our whole log (it is durable there): all it can learn
            # is the commit index, and its answer would tell us nothing. COMMIT is not answered.
            self._send(Message(MsgType.COMMIT, to, self.id, self.term, commit=log.committed))
            self.commits_queued = True
            return True
        self._send(
            Message(
                MsgType.APP,
                to,
                self.id,
                self.term,
                log_term=prev_term,
                index=prev,
                entries=ents,
                commit=log.committed,
            )
        )
        pr.sent_entries(ents[-1].index if ents else prev, len(ents))
        return True

    def _send_snapshot(self, to: NodeId, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not stream a snapshot at a node that is probably down
        meta = self.log.snapshot
        self._send(Message(MsgType.SNAP, to, self.id, self.term, snapshot=Snapshot(meta)))
        pr.become_snapshot(meta.index)
        self.notes.append(f"sending snapshot at index {meta.index} to {to}")
        return True

    def _bcast_append(self) -> None:
        for pid in self.prs:
            if pid != self.id:
                self._send_append(pid)

    def _bcast_heartbeat(self, ctx: bytes) -> None:
        for pid, pr in self.prs.items():
            if pid != self.id:
                # Never let a follower commit past what it is known to hold.
                commit = min(pr.match, self.log.committed)
                self._send(
                    Message(MsgType.HEARTBEAT, pid, self.id, self.term, commit=commit, context=ctx)
                )

    def _maybe_commit(self) -> bool:
        idx = quorum_index([self.prs[v].match for v in self.conf.voters if v in self.prs])
        # §5.4.2: only entries of the current term are committed by counting.
        if idx > self.log.committed and self.log.term(idx) == self.term:
            first_in_term = self.log.term(self.log.committed) != self.term
            self.log.commit_to(idx)
            if first_in_term:
                self._release_pending_reads()
            return True
        return False

    def _append(self, entries: list[Entry]) -> None:
        self.log.append(entries)
        me = self.prs.get(self.id)
        if me is not None:
            me.maybe_update(self.log.last_index())
        self._maybe_commit()

    def read_index(self, ctx: bytes) -> None:
        """Request a linearizable read point; answered as a ReadState with this (unique) ctx."""
        if self.role is Role.LEADER:
            self._read_index(ctx, NONE)
        elif self.lead != NONE:
            self._send(Message(MsgType.READ_INDEX, self.lead, self.id, self.term, context=ctx))
        else:
            raise ProposalDropped("no leader known", NONE)

    def _read_index(self, ctx: bytes, frm: NodeId) -> None:
        if self.log.term(self.log.committed) != self.term:
            # Until we commit an entry of our term we do not know the real commit index.
            self.pending_reads.append((ctx, frm))
            return
        req = ReadRequest(self.log.committed, frm, {self.id})
        if len(self.conf.voters) == 1:
            self._answer_read(ctx, req)
            return
        self.reads[ctx] = req
        self._bcast_heartbeat(ctx)

    def _release_pending_reads(self) -> None:
        pending, self.pending_reads = self.pending_reads, []
        for ctx, frm in pending:
            self._read_index(ctx, frm)

    def _last_read_context(self) -> bytes:
        return next(reversed(self.reads)) if self.reads else b""

    def _ack_read(self, ctx: bytes, frm: NodeId) -> None:
        req = self.reads.get(ctx)
        if req is None:
            return
        req.acks.add(frm)
        if sum(1 for v in self.conf.voters if v in req.acks) * 2 <= len(self.conf.voters):
            return
        # A quorum confirmed our leadership after every earlier request too: answer them all.
        while self.reads:
            first_ctx, first = next(iter(self.reads.items()))
            del self.reads[first_ctx]
            self._answer_read(first_ctx, first)
            if first_ctx == ctx:
                break

    def _answer_read(self, ctx: bytes, req: ReadRequest) -> None:
        if req.frm == NONE:
            self.read_states.append(ReadState(req.index, ctx))
        else:
            self._send(
                Message(
                    MsgType.READ_INDEX_RESP,
                    req.frm,
                    self.id,
                    self.term,
                    index=req.index,
                    context=ctx,
                )
            )
