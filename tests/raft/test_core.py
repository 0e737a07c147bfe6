"""Focused unit tests of the sans-IO Raft core (`orchestrator.raft.core.RaftCore`).

Each test drives a few cores through the synchronous in-memory network in `harness.py`: no
threads, no clocks, seeded randomness only. The whole-cluster randomized simulation lives in
`orchestrator/testing/raft_sim.py`; these tests pin down one mechanism each (elections, pre-vote,
check-quorum and the leader lease, replication and the §5.4.2 commit rule, fast back-off, flow
control, snapshots, membership changes, ReadIndex, leadership transfer, membership filtering of
senders, restart from persisted state).

Some tests reproduce liveness bugs found while writing them (now fixed); their docstrings give
the scenario that used to leave a cluster without a leader.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import Cluster, StateMachine, describe_status, entries_of

from orchestrator.raft import core as core_module
from orchestrator.raft.core import TRANSFER_CONTEXT
from orchestrator.raft.progress import ProgressState
from orchestrator.raft.types import (
    ConfChangeType,
    Entry,
    EntryType,
    HardState,
    Message,
    MsgType,
    NodeId,
    ProposalDropped,
    ReadState,
    Role,
    Snapshot,
    SnapshotMeta,
)

ELECTION = 10  # RaftConfig.election_tick default


def elected(n: int = 3, leader: NodeId = 1, **config: Any) -> Cluster:
    """A cluster of n founders where `leader` won term 2 and everything is delivered."""
    c = Cluster(n, **config)
    c.elect(leader)
    c.deliver_all()
    return c


def role(c: Cluster, nid: NodeId) -> Role:
    """The node's role now (a call, so type checkers do not carry narrowing across steps)."""
    return c[nid].role


def sent_since(c: Cluster, start: int, **match: object) -> list[Message]:
    return [m for m in c.sent[start:] if all(getattr(m, k) == v for k, v in match.items())]


def assert_logs_match(c: Cluster, nids: list[NodeId]) -> None:
    ref = c[nids[0]].log
    for nid in nids[1:]:
        log = c[nid].log
        assert log.last_index() == ref.last_index(), (nid, describe_status(c[nid]))
        for i in range(max(log.first_index(), ref.first_index()), log.last_index() + 1):
            assert log.term(i) == ref.term(i), (nid, i)


# ---------------------------------------------------------------------------- elections
def test_single_node_campaign_becomes_leader_and_commits() -> None:
    c = Cluster(1)
    out = c.campaign(1)
    core = c[1]
    assert core.role is Role.LEADER
    assert core.term == 2
    assert core.vote == 1
    # The empty entry of the new term is committed at once (a quorum of one).
    assert entries_of(core) == [(1, 1), (2, 2)]
    assert core.log.committed == 2
    assert "1 state: leader term=2 leader=1" in out
    assert not [line for line in out if "->" in line]  # nobody to talk to


def test_three_node_election() -> None:
    c = Cluster(3)
    out = c.campaign(1)
    # Pre-vote first: asks for term 2 without moving to it.
    assert out[-2:] == ["1->2 PRE_VOTE term=2 log=1/3", "1->3 PRE_VOTE term=2 log=1/3"]
    assert c[1].term == 1
    assert c[1].role is Role.PRE_CANDIDATE
    c.deliver_all()
    for nid in (1, 2, 3):
        core = c[nid]
        assert (core.term, core.lead, core.vote, core.log.committed) == (2, 1, 1, 4)
    assert role(c, 1) is Role.LEADER
    assert c[2].role is c[3].role is Role.FOLLOWER


def test_election_by_timeout_is_deterministic() -> None:
    def run(seed: int) -> tuple[NodeId, list[str]]:
        c = Cluster(3, seed=seed)
        lead = c.tick_until_leader([1, 2, 3])
        return lead, c.trace

    assert run(7) == run(7)
    assert len({run(s)[0] for s in range(8)}) > 1  # the jitter does pick different winners


def test_election_restriction_stale_log_cannot_win() -> None:
    """§5.4.1: a candidate whose log is behind is refused, whatever its term."""
    c = elected(pre_vote=False, check_quorum=False)
    c.isolate(3)
    c.propose(1, b"a")
    c.deliver_all()
    c.heal()
    start = len(c.sent)
    c.campaign(3)  # term 3, last entry 2/4 against 2/5
    c.deliver_all()
    answers = sent_since(c, start, to=3, type=MsgType.VOTE_RESP)
    assert [(m.frm, m.reject) for m in answers] == [(1, True), (2, True)]
    assert c[3].role is Role.FOLLOWER
    # The higher term deposed the leader, but only an up-to-date node can win term 4+.
    lead = c.tick_until_leader([1, 2, 3])
    assert lead in (1, 2)
    assert c[lead].log.term(5) == 2


# ---------------------------------------------------------------------------- pre-vote
def test_prevote_partitioned_node_does_not_increase_its_term() -> None:
    c = elected()
    c.isolate(3)
    start = len(c.sent)
    c.tick(3, 10 * ELECTION)
    c.deliver_all()
    pre_votes = sent_since(c, start, frm=3, type=MsgType.PRE_VOTE)
    assert len(pre_votes) >= 2 * 5  # it kept trying ...
    assert {m.term for m in pre_votes} == {3}  # ... always asking for term 3 ...
    assert c[3].term == 2  # ... without ever moving there
    assert c[3].role is Role.PRE_CANDIDATE
    assert not sent_since(c, start, frm=3, type=MsgType.VOTE)


def test_prevote_rejoining_node_does_not_disrupt_the_leader() -> None:
    c = elected()
    c.isolate(3)
    c.tick(3, 5 * ELECTION)
    c.propose(1, b"while-3-was-away")
    c.deliver_all()
    c.heal()
    # 3's next pre-vote reaches the others: both heard from the leader within an election
    # timeout (the lease), so they ignore it; the leader's next heartbeat brings 3 back.
    start = len(c.sent)
    c.tick(3, 2 * ELECTION)
    c.deliver_all()
    assert sent_since(c, start, frm=3, type=MsgType.PRE_VOTE)
    assert not sent_since(c, start, to=3, type=MsgType.PRE_VOTE_RESP)
    c.tick(1)
    c.deliver_all()
    assert c.leader() == 1
    assert [c[n].term for n in (1, 2, 3)] == [2, 2, 2]
    assert c[3].role is Role.FOLLOWER
    assert c[3].lead == 1
    assert c.nodes[3].sm.data() == [b"while-3-was-away"]


def test_prevote_is_refused_to_a_stale_log_without_lease() -> None:
    # Without check-quorum there is no lease: the pre-vote is answered, and refused because
    # 3's log is behind; nobody's term moves.
    c = elected(check_quorum=False)
    c.isolate(3)
    c.propose(1, b"x")
    c.deliver_all()
    c.heal()
    start = len(c.sent)
    c.campaign(3)
    c.deliver_all()
    answers = sent_since(c, start, to=3, type=MsgType.PRE_VOTE_RESP)
    assert len(answers) == 2
    assert all(m.reject for m in answers)
    assert [c[n].term for n in (1, 2, 3)] == [2, 2, 2]
    assert c.leader() == 1


def test_without_prevote_a_partitioned_node_disrupts_on_rejoin() -> None:
    # The contrast case showing what pre-vote buys.
    c = elected(pre_vote=False, check_quorum=False)
    c.isolate(3)
    c.tick(3, 5 * ELECTION)
    assert c[3].term > 4
    c.heal()
    c.tick(1)
    c.deliver_all()
    assert c[1].term == c[3].term  # the leader learned the inflated term and stepped down


# ---------------------------------------------------------------------------- check quorum / lease
def test_check_quorum_isolated_leader_steps_down() -> None:
    c = elected()
    c.isolate(1)
    c.tick(1, ELECTION)
    assert c[1].role is Role.LEADER  # active in the previous election timeout
    out = c.tick(1, ELECTION)
    assert role(c, 1) is Role.FOLLOWER
    assert c[1].lead == 0
    assert c[1].term == 2
    assert "1 note: stepping down at term 2: quorum not heard from" in out
    with pytest.raises(ProposalDropped):
        c[1].propose([b"x"])


def test_check_quorum_connected_leader_stays() -> None:
    c = elected()
    for _ in range(5 * ELECTION):
        c.tick(1)
        c.deliver_all()
    assert c[1].role is Role.LEADER
    assert c[1].term == 2


def test_check_quorum_leader_with_one_live_follower_stays() -> None:
    c = elected()
    c.partition([1, 2], [3])
    for _ in range(5 * ELECTION):
        c.tick(1)
        c.deliver_all()
    assert c[1].role is Role.LEADER


def test_leader_lease_follower_ignores_higher_term_vote() -> None:
    c = elected()
    f = c[2]
    assert f.election_elapsed < ELECTION
    vote = Message(MsgType.VOTE, 2, 3, term=9, log_term=f.log.last_term(), index=f.log.last_index())
    f.step(vote)
    out = c.process(2)
    assert (f.term, f.vote, f.lead) == (2, 1, 1)
    assert out == []  # not even a rejection
    # The leader ignores it too.
    c[1].step(Message(MsgType.VOTE, 1, 3, term=9, log_term=9, index=100))
    assert c.process(1) == []
    assert c[1].role is Role.LEADER
    # Once an election timeout passes without hearing from the leader, the same vote wins.
    for _ in range(ELECTION):
        f.tick()
    c.process(2)
    c.inflight.clear()
    f.step(vote)
    assert c.process(2)[-1] == "2->3 VOTE_RESP term=9"
    assert (f.term, f.vote) == (9, 3)


def test_lease_does_not_block_transfer_votes() -> None:
    c = elected()
    f = c[2]
    f.step(
        Message(
            MsgType.VOTE,
            2,
            3,
            term=3,
            log_term=f.log.last_term(),
            index=f.log.last_index(),
            context=TRANSFER_CONTEXT,
        )
    )
    assert c.process(2)[-1] == "2->3 VOTE_RESP term=3"


# ---------------------------------------------------------------------------- leader down
def tick_all(c: Cluster, nids: list[NodeId], n: int) -> None:
    """n rounds of one tick per node, delivering everything after each round."""
    for _ in range(n):
        for nid in nids:
            c[nid].tick()
        c.deliver_all()


def test_leader_down_followers_elect_a_new_leader_within_a_few_ticks() -> None:
    c = elected(5, leader=3)
    c.crash(3)
    for nid in (1, 2, 4, 5):
        c.report_down(nid, 3)
        assert c[nid].lead == 0  # forgotten: requests fail at once instead of going nowhere
    # The others take turns in id order, two ticks apart, starting at their second tick.
    assert [c[n].down_campaign_delay(3) for n in (1, 2, 4, 5)] == [2, 4, 6, 8]
    start = len(c.sent)
    tick_all(c, [1, 2, 4, 5], 2)
    assert c.leader() == 1
    assert [c[n].term for n in (1, 2, 4, 5)] == [3, 3, 3, 3]
    # Only node 1 campaigned: no split vote, no second round.
    assert {m.frm for m in sent_since(c, start, type=MsgType.PRE_VOTE)} == {1}
    assert {m.frm for m in sent_since(c, start, type=MsgType.VOTE)} == {1}
    assert c[1].election_elapsed < ELECTION  # well before any randomized timeout


def test_leader_down_next_in_line_wins_when_the_first_is_behind() -> None:
    """Node 2, first in line, missed the last entry: node 3 refuses its pre-vote, then
    campaigns at its own turn and wins; the committed entry survives."""
    c = elected()
    c.block(1, 2, [MsgType.APP])
    c.propose(1, b"x")
    c.deliver_all()
    assert c[1].log.committed == 5
    c.crash(1)
    c.heal()
    c.report_down(2, 1)
    c.report_down(3, 1)
    tick_all(c, [2, 3], 2)
    assert role(c, 2) is Role.PRE_CANDIDATE
    assert c[2].term == 2  # pre-vote: no term inflation
    tick_all(c, [2, 3], 2)
    assert c.leader() == 3
    assert c[3].term == 3
    c.deliver_all()
    assert c.nodes[2].sm.data() == c.nodes[3].sm.data() == [b"x"]


def test_leader_down_report_under_a_live_leader_disrupts_nothing() -> None:
    """A connection reset while the leader lives: the follower forgets it and pre-votes at its
    turn, the others (in their lease) ignore that, and the next heartbeat restores it."""
    c = elected()
    c.report_down(2, 1)
    assert c[2].lead == 0
    start = len(c.sent)
    c.tick(2, 2)
    c.deliver_all()
    assert sent_since(c, start, frm=2, type=MsgType.PRE_VOTE)
    assert not sent_since(c, start, to=2, type=MsgType.PRE_VOTE_RESP)
    assert role(c, 2) is Role.PRE_CANDIDATE
    c.tick(1)
    c.deliver_all()
    assert (c[2].role, c[2].lead) == (Role.FOLLOWER, 1)
    assert [c[n].term for n in (1, 2, 3)] == [2, 2, 2]
    assert not sent_since(c, start, type=MsgType.VOTE)


def test_leader_down_news_from_the_leader_cancels_the_early_campaign() -> None:
    c = elected()
    c.report_down(2, 1)
    assert c[2].down_campaign_at > 0
    c.tick(1)  # a heartbeat (e.g. over a new connection) arrives first
    c.deliver_all()
    assert (c[2].lead, c[2].down_campaign_at) == (1, 0)
    start = len(c.sent)
    c.tick(2, ELECTION - 1)
    assert not sent_since(c, start, frm=2, type=MsgType.PRE_VOTE)


def test_leader_down_only_news_about_our_leader_counts() -> None:
    c = elected()
    for nid, peer in ((2, 3), (1, 2), (2, 0), (2, 2)):
        assert c.report_down(nid, peer) == []
    assert [(c[n].lead, c[n].down_campaign_at) for n in (1, 2, 3)] == [(1, 0), (1, 0), (1, 0)]


def test_leader_down_without_prevote_only_forgets_the_leader() -> None:
    """Without pre-vote an early campaign would raise the term even under a live leader."""
    c = elected(pre_vote=False)
    c.report_down(2, 1)
    assert (c[2].lead, c[2].down_campaign_at) == (0, 0)


def test_leader_down_learner_forgets_the_leader_but_does_not_campaign() -> None:
    c = elected(joiners=[4])
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    c.tick(1)
    c.deliver_all()
    assert c[4].lead == 1
    c.report_down(4, 1)
    assert (c[4].lead, c[4].down_campaign_at) == (0, 0)


# ---------------------------------------------------------------------------- replication
def test_log_replication_and_commit() -> None:
    c = elected()
    first, term = c[1].propose([b"a", b"b"])
    assert (first, term) == (5, 2)
    c.process(1)
    c.propose(1, b"c")
    c.deliver_all()
    for nid in (1, 2, 3):
        assert c[nid].log.committed == 7
        assert c.nodes[nid].sm.data() == [b"a", b"b", b"c"]
    assert_logs_match(c, [1, 2, 3])


def test_commit_needs_a_quorum() -> None:
    c = elected()
    c.block(2, 1)
    c.block(3, 1)
    c.propose(1, b"a")
    c.deliver_all()
    assert c[1].log.committed == 4
    assert c[2].log.last_index() == c[3].log.last_index() == 5
    c.heal()
    c.block(3, 1)
    c.tick(1)  # heartbeat: 2's answer gets through; the leader learns 2 holds index 5
    c.deliver_all()
    assert c[1].log.committed == 5
    assert c.nodes[1].sm.data() == [b"a"]


def test_followers_do_not_propose() -> None:
    c = elected()
    with pytest.raises(ProposalDropped) as exc:
        c[2].propose([b"x"])
    assert exc.value.leader == 1


def test_figure8_leader_commits_old_term_entries_only_through_its_own() -> None:
    """Raft paper Figure 8 on five nodes (no check-quorum so crashed peers do not matter;
    one entry per append so each step is visible)."""
    c = elected(5, check_quorum=False, max_msg_bytes=1)  # term 2, log 1..5 @1, 6 @2
    # (a) leader 1 replicates 7@2 to node 2 only, then crashes.
    c.partition([1, 2], [3, 4, 5])
    c.propose(1, b"old")
    c.deliver_all()
    assert (c[1].log.committed, c[2].log.term(7)) == (6, 2)
    c.crash(1)
    # (b) 5 wins term 3 with votes from 3 and 4, appends 7@3 locally, and crashes.
    c.heal()
    c.block(5, None, [MsgType.APP])
    c.elect(5)
    assert c[5].term == 3
    assert c[5].log.term(7) == 3
    c.crash(5)
    c.heal()
    # (c) 1 restarts and wins term 4 (2, 3, 4 vote: its last entry 7@2 beats their 6@2).
    c.restart(1)
    c.campaign(1)
    c.deliver_all()  # its pre-vote learns term 3 from 3 and 4 ...

    # ... so the second campaign succeeds. It replicates 7@2 to 3 and 4, but every append
    # carrying its term-4 entry that would be accepted is lost: 7@2 is then on a majority
    # (1, 3, 4 as far as the leader knows; 2 too) yet must not be committed.
    def carries_term4(m: Message) -> bool:
        accepted = c[m.to].log.term(m.index) == m.log_term
        return m.type is MsgType.APP and accepted and any(e.term == 4 for e in m.entries)

    c.campaign(1)
    c.deliver_all(drop=carries_term4)
    assert c[1].role is Role.LEADER
    assert c[1].term == 4
    assert c[1].log.term(8) == 4  # the empty entry of term 4
    held = [c[n].log.term(7) for n in (1, 2, 3, 4)]
    assert held == [2, 2, 2, 2]
    assert sorted(pr.match for pr in c[1].prs.values())[-3:] == [7, 7, 8]
    assert c[1].log.committed == 6
    # Once 8@4 reaches a majority, 8 (and with it 7@2) commits.
    c.tick(1)
    c.deliver_all()
    for n in (1, 2, 3, 4):
        assert c[n].log.committed == 8
        assert c.nodes[n].sm.data() == [b"old"]
    # 5 comes back: its 7@3 is overwritten.
    c.restart(5)
    c.tick(1)
    c.deliver_all()
    assert c[5].log.term(7) == 2
    assert_logs_match(c, [1, 2, 3, 4, 5])


def test_figure8_log_matching_after_leader_change() -> None:
    c = elected(check_quorum=False)
    c.isolate(1)
    c[1].propose([b"lost1", b"lost2", b"lost3"])  # never leave node 1
    c.process(1)
    lead = c.tick_until_leader([2, 3])
    c.propose(lead, b"kept")
    c.deliver_all()
    c.heal()
    c.tick(lead)
    c.deliver_all()
    assert c[1].role is Role.FOLLOWER
    assert_logs_match(c, [1, 2, 3])
    assert c.nodes[1].sm.data() == [b"kept"]


# ---------------------------------------------------------------------------- fast back-off
def rejections(c: Cluster, start: int, frm: NodeId) -> int:
    return len([m for m in sent_since(c, start, frm=frm, type=MsgType.APP_RESP) if m.reject])


def test_fast_backoff_long_divergent_log_repaired_in_one_rejection() -> None:
    c = elected()
    c.isolate(1)
    # The deposed leader piles up 100 entries of term 2 that nobody else has.
    c[1].propose([f"lost{i}".encode() for i in range(100)])
    c.process(1)
    lead = c.tick_until_leader([2, 3])
    c.propose(lead, b"k1", b"k2")
    c.deliver_all()
    # A second leader change, so the new leader's first probe is past the common prefix.
    other = 5 - lead
    c.transfer(lead, other)
    c.deliver_all()
    lead = other
    assert c.leader() == lead
    assert c[1].log.last_index() == 104
    c.heal()
    start = len(c.sent)
    c.tick(lead)
    rounds = c.rounds_until_quiet()
    # One probe rejected (the hint skips all 100 entries of term 2 at once), one accepted:
    # heartbeat, answer, probe, rejection, repair, ack, (empty append, ack) = 8 rounds,
    # where one-entry-at-a-time back-off would need ~200.
    assert rejections(c, start, 1) == 1
    assert len(sent_since(c, start, frm=lead, to=1, type=MsgType.APP)) <= 3
    assert rounds <= 8
    assert_logs_match(c, [1, 2, 3])
    assert c.nodes[1].sm.data() == [b"k1", b"k2"]


# The leader and followers of Raft paper Figure 7, as terms after the 7 bootstrap entries.
FIG7_LEADER = [4, 4, 5, 5, 6, 6, 6]
FIG7_FOLLOWERS = {
    "a": [4, 4, 5, 5, 6, 6],
    "b": [4],
    "c": [4, 4, 5, 5, 6, 6, 6, 6],
    "d": [4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [4, 4, 4, 4],
    "f": [2, 2, 2, 3, 3, 3, 3, 3],
}


def test_fast_backoff_figure7_every_follower_repaired_quickly() -> None:
    names = sorted(FIG7_FOLLOWERS)
    logs = {1: FIG7_LEADER} | {i + 2: FIG7_FOLLOWERS[n] for i, n in enumerate(names)}
    c = Cluster.with_logs(logs, term=7)
    c.deliver_all()  # apply the bootstrap entries
    start = len(c.sent)
    c.elect(1)  # term 8: a, b, e, f vote for it (c and d hold longer / newer logs)
    c.deliver_all()
    assert c[1].term == 8
    for nid in range(2, 8):
        # At most one rejected probe per follower; naive back-off would need up to 9.
        assert rejections(c, start, nid) <= 1, (names[nid - 2], rejections(c, start, nid))
    assert_logs_match(c, list(range(1, 8)))
    assert c[1].log.committed == c[1].log.last_index() == 15


def test_fast_backoff_follower_with_higher_term_suffix() -> None:
    # Follower 2 holds a long suffix from a failed term-5 leader (higher than the leader's
    # matching entries of term 4): the hint walks back over all of it at once.
    logs = {1: [4] * 6, 2: [2, 2] + [5] * 40, 3: [4] * 6}
    c = Cluster.with_logs(logs, term=6)
    c.deliver_all()
    start = len(c.sent)
    c.elect(1)
    c.deliver_all()
    assert rejections(c, start, 2) <= 2
    assert_logs_match(c, [1, 2, 3])


# ---------------------------------------------------------------------------- flow control
def test_flow_control_max_inflight() -> None:
    c = elected(max_inflight=2)
    pr = c[1].prs[2]
    assert pr.state is ProgressState.REPLICATE
    start = len(c.sent)
    for i in range(5):
        c.propose(1, f"p{i}".encode())
    apps = sent_since(c, start, to=2, type=MsgType.APP)
    assert [[e.index for e in m.entries] for m in apps] == [[5], [6]]
    assert pr.is_paused()
    assert list(pr.inflight) == [5, 6]
    # Acks free the window: the rest goes out in one batch.
    c.deliver_round()  # the two appends reach 2 (and 3)
    start = len(c.sent)
    c.deliver_round()  # their acks reach the leader
    apps = sent_since(c, start, to=2, type=MsgType.APP)
    assert [e.index for m in apps for e in m.entries] == [7, 8, 9]
    c.deliver_all()
    assert c.nodes[2].sm.data() == [b"p0", b"p1", b"p2", b"p3", b"p4"]
    assert not pr.inflight


def test_flow_control_heartbeat_response_frees_one_slot() -> None:
    c = elected(max_inflight=2)
    c.block(1, 2, [MsgType.APP])  # appends to 2 are lost; heartbeats get through
    for i in range(3):
        c.propose(1, f"p{i}".encode())
    pr = c[1].prs[2]
    assert pr.is_paused()
    c.deliver_all()
    c.heal()
    start = len(c.sent)
    c.tick(1)
    c.deliver_all()
    # The heartbeat answer unblocks one append; 2's rejection (it lacks 5) sends the leader
    # back to probing and the log is repaired.
    assert sent_since(c, start, frm=1, to=2, type=MsgType.APP)
    assert c[2].log.committed == 7
    assert c.nodes[2].sm.data() == [b"p0", b"p1", b"p2"]


# ---------------------------------------------------------------------------- snapshots
def test_snapshot_sent_to_lagging_follower_which_catches_up() -> None:
    c = elected()
    c.isolate(3)
    for i in range(10):
        c.propose(1, f"v{i}".encode())
    c.deliver_all()
    assert c[1].log.committed == 14
    meta = c.compact(1)
    assert (meta.index, meta.term, sorted(meta.conf.voters)) == (14, 2, [1, 2, 3])
    assert c[1].log.first_index() == 15
    c.heal()
    start = len(c.sent)
    c.tick(1)
    out = c.deliver_all()
    snaps = sent_since(c, start, type=MsgType.SNAP)
    assert [(m.frm, m.to) for m in snaps] == [(1, 3)]
    assert snaps[0].snapshot is not None
    assert snaps[0].snapshot.data  # the driver filled in the state-machine data
    assert "3 note: installing snapshot at index 14 term 2" in out
    assert "3 snapshot: 2/14 voters=[1 2 3]" in out
    assert c[3].log.first_index() == 15
    assert c[3].conf == c[1].conf
    # It keeps up with what follows.
    c.propose(1, b"after")
    c.deliver_all()
    assert c[3].log.committed == 15
    assert c.nodes[3].sm.data() == c.nodes[1].sm.data()
    assert c.nodes[3].sm.data()[-2:] == [b"v9", b"after"]
    assert c[1].prs[3].state is ProgressState.REPLICATE


def test_snapshot_restart_from_snapshot_and_tail() -> None:
    c = elected()
    for i in range(6):
        c.propose(1, f"v{i}".encode())
    c.deliver_all()
    c.compact(2, keep=2)  # snapshot at 10, log keeps 9..10 (a tail for slow followers)
    assert c[2].log.first_index() == 9
    c.crash(2)
    c.restart(2)
    core = c[2]
    assert core.log.first_index() == 11  # a restart starts the log right after the snapshot
    assert core.log.committed == 10
    assert sorted(core.conf.voters) == [1, 2, 3]
    out = c.process(2)
    assert not [line for line in out if "apply" in line]  # nothing applied twice
    c.propose(1, b"more")
    c.deliver_all()
    assert c.nodes[2].sm.data()[-1] == b"more"


def test_snapshot_failed_send_is_retried() -> None:
    c = elected()
    c.isolate(3)
    for i in range(3):
        c.propose(1, f"v{i}".encode())
    c.deliver_all()
    c.compact(1)
    c.heal()
    c.block(1, 3, [MsgType.SNAP])
    c.tick(1)
    c.deliver_all()
    assert c[1].prs[3].state is ProgressState.PROBE  # reported sent, no answer yet
    c.heal()
    c.tick(1)
    c.deliver_all()
    assert c.nodes[3].sm.data() == [b"v0", b"v1", b"v2"]


# ---------------------------------------------------------------------------- membership
def test_add_learner_promote_and_remove_leader() -> None:
    c = Cluster(3, joiners=[4])
    c.elect(1)
    c.deliver_all()
    c.propose(1, b"before")
    c.deliver_all()
    # Add 4 as a learner: it replicates the whole log and learns the membership from it.
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    for nid in (1, 2, 3, 4):
        assert sorted(c[nid].conf.voters) == [1, 2, 3], nid
        assert sorted(c[nid].conf.learners) == [4], nid
    assert c.nodes[4].sm.data() == [b"before"]
    assert c[1].prs[4].is_learner
    # A learner never campaigns.
    start = len(c.sent)
    c.campaign(4)
    c.tick(4, 5 * ELECTION)
    assert not sent_since(c, start, frm=4)
    assert c[4].role is Role.FOLLOWER
    # ... and does not count for commit: leader + learner is not a quorum of 3 voters.
    c.partition([1, 4], [2, 3])
    c.propose(1, b"x")
    c.deliver_all()
    assert c[1].prs[4].match == c[1].log.last_index()
    assert c[1].log.committed == c[1].log.last_index() - 1
    c.heal()
    c.tick(1)
    c.deliver_all()
    assert c[1].log.committed == c[1].log.last_index()
    # Promote 4: now 3 of 4 voters are needed.
    c.conf_change(1, ConfChangeType.ADD_VOTER, 4)
    c.deliver_all()
    for nid in (1, 2, 3, 4):
        assert sorted(c[nid].conf.voters) == [1, 2, 3, 4], nid
        assert not c[nid].conf.learners
    c.partition([1, 4], [2, 3])
    c.propose(1, b"y")
    c.deliver_all()
    assert c[1].log.committed == c[1].log.last_index() - 1
    c.partition([1, 2, 4], [3])
    c.tick(1)
    c.deliver_all()
    assert c[1].log.committed == c[1].log.last_index()
    c.heal()
    c.tick(1)
    c.deliver_all()
    # Remove the leader itself: once the change applies it hands over to an up-to-date voter.
    out_before = len(c.trace)
    c.conf_change(1, ConfChangeType.REMOVE, 1)
    c.deliver_all()
    assert "1 note: removed from the voters: handing over leadership" in c.trace[out_before:]
    assert c[1].role is Role.FOLLOWER
    assert c.leader() in (2, 3, 4)
    for nid in (2, 3, 4):
        assert sorted(c[nid].conf.voters) == [2, 3, 4], describe_status(c[nid])
    new = c.tick_until_leader([1, 2, 3, 4])
    assert new in (2, 3, 4)
    # The removed node never campaigns again, and the remaining three still commit.
    start = len(c.sent)
    c.tick(1, 5 * ELECTION)
    assert not [
        m for m in sent_since(c, start, frm=1) if m.type in (MsgType.VOTE, MsgType.PRE_VOTE)
    ]
    c.partition([2, 3, 4], [1])
    c.propose(new, b"z")
    c.deliver_all()
    assert c.nodes[new].sm.data()[-1] == b"z"


def test_remove_follower() -> None:
    c = elected()
    c.conf_change(1, ConfChangeType.REMOVE, 3)
    c.deliver_all()
    assert sorted(c[1].conf.voters) == [1, 2]
    assert 3 not in c[1].prs
    # 2 of 2 now; 3 is not needed, and its messages are dropped as a non-member.
    c.isolate(3)
    c.propose(1, b"x")
    c.deliver_all()
    assert c[1].log.committed == c[1].log.last_index()


def test_learner_joins_after_compaction_via_snapshot() -> None:
    c = Cluster(3, joiners=[4])
    c.elect(1)
    c.propose(1, b"a", b"b")
    c.deliver_all()
    c.compact(1)
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    snaps = sent_since(c, 0, type=MsgType.SNAP)
    assert [(m.frm, m.to) for m in snaps] == [(1, 4)]
    assert c.nodes[4].sm.data() == [b"a", b"b"]
    assert sorted(c[4].conf.learners) == [4]  # the conf in the snapshot, then the log entry
    assert c[4].log.committed == c[1].log.committed


def test_removed_node_that_missed_its_removal_cannot_disrupt() -> None:
    c = elected()
    c.isolate(3)
    c.conf_change(1, ConfChangeType.REMOVE, 3)
    c.deliver_all()
    assert sorted(c[1].conf.voters) == [1, 2]
    assert sorted(c[3].conf.voters) == [1, 2, 3]  # 3 never heard
    c.heal()
    start = len(c.trace)
    c.tick(3, 5 * ELECTION)
    c.deliver_all()
    notes = [line for line in c.trace[start:] if "non-member" in line]
    assert "1 note: dropped PRE_VOTE from non-member 3" in notes
    assert "2 note: dropped PRE_VOTE from non-member 3" in notes
    assert c.leader() == 1
    assert c[1].term == c[2].term == 2


def test_single_voter_with_learner_replicates() -> None:
    c = Cluster(1, joiners=[2])
    c.campaign(1)
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 2)
    c.deliver_all()
    c.propose(1, b"x")
    c.deliver_all()
    assert c.nodes[2].sm.data() == [b"x"]
    assert c[2].log.committed == c[1].log.committed


def test_removed_leader_of_two_voters_hands_over() -> None:
    """Voters {1, 2}, leader 1 removes itself (index k) and proposes one more entry, whose
    append to 2 is lost, so 2 does not learn that k committed and still counts on 1's vote
    (with a longer log, 1 would refuse it). The removed leader must hand over: bring 2 up to
    date and tell it to campaign, then step down."""
    c = Cluster(1, joiners=[2])
    c.campaign(1)
    c.conf_change(1, ConfChangeType.ADD_VOTER, 2)
    c.deliver_all()
    assert sorted(c[2].conf.voters) == [1, 2]
    k, _ = c.conf_change(1, ConfChangeType.REMOVE, 1)
    c.propose(1, b"after")
    lost = c.take(lambda m: m.type is MsgType.APP and any(e.index == k + 1 for e in m.entries))
    assert len(lost) == 1  # the only message lost in this test
    c.deliver_all()
    for _ in range(3 * ELECTION):
        c[1].tick()
        c[2].tick()
        c.deliver_all()
    assert c.leader() == 2
    assert sorted(c[2].conf.voters) == [2]
    assert c[1].role is Role.FOLLOWER
    with pytest.raises(ProposalDropped):
        c.propose(1, b"refused: not a leader any more")


def test_partitioned_voter_that_missed_a_replace_still_lets_the_cluster_recover() -> None:
    """Used to leave the cluster leaderless; the only fault is one partition, then it heals.

    Voters {1, 3}, leader 1; node 2 is being swapped in for 1 (add voter 2, then remove 1, the
    simulation's own replacement pattern). 3 appends and acks `add-voter(2)` (index 4), then
    is partitioned away before it hears that index 4 committed: 3 stays at membership {1, 3}.
    With {1, 2} (a quorum of {1, 2, 3}) the leader commits `remove(1)` (index 5) and hands
    over to 2, but 2 needs 3's vote and 3 is away; 1 steps down after an election timeout.
    After healing:
    - 2 (membership {2, 3}) asks 3 for votes; 3 drops them: "dropped PRE_VOTE from
      non-member 2" (`_accept_sender`: 2 is not in 3's stale membership);
    - 3 (membership {1, 3}) needs 1's vote; 1 refuses (its log has index 5, 3's ends at 4);
    - 1 is no voter any more (membership {2, 3}), so it never campaigns.
    Nobody can ever bring 3 up to date, and the cluster has no leader forever. Fixes: accept
    vote requests from senders named in conf-change entries of one's own log (3 holds
    `add-voter(2)`), or as etcd-io/raft, no membership filter on votes; or keep a removed
    leader in charge until the remaining voters have caught up."""
    c = Cluster(1, joiners=[2, 3])
    c.campaign(1)
    c.conf_change(1, ConfChangeType.ADD_VOTER, 3)
    c.deliver_all()
    c.conf_change(1, ConfChangeType.ADD_VOTER, 2)
    c.deliver_round()  # 3 appends add-voter(2) and acks it
    c.deliver_round()  # 1 commits it with {1, 3} and applies it; the commit index is in flight
    c.isolate(3)
    c.deliver_all()  # 2 catches up
    assert sorted(c[1].conf.voters) == [1, 2, 3]
    assert sorted(c[3].conf.voters) == [1, 3]
    c.conf_change(1, ConfChangeType.REMOVE, 1)
    c.deliver_all()
    for _ in range(3 * ELECTION):
        c[1].tick()
        c[2].tick()
        c.deliver_all()
    assert c[1].role is Role.FOLLOWER
    assert sorted(c[2].conf.voters) == [2, 3]
    c.heal()
    for _ in range(50 * ELECTION):
        for nid in (1, 2, 3):
            c[nid].tick()
        c.deliver_all()
    assert c.leader() in (2, 3)  # fails: None
    c.propose(c.leader() or 2, b"recovered")


def test_new_voter_with_empty_log_answers_votes() -> None:
    """Used to leave the pair leaderless: `ADD_VOTER` of a brand-new node is accepted by
    `propose_conf_change`; in a one-voter cluster it commits at once, making {1, 2} the
    voters while 2 has an empty log and no membership. If 1 stops leading before 2 has
    replicated anything (here: messages to 2 are lost, then 1 restarts), 1 needs 2's vote,
    and 2 drops every request: `_accept_sender` accepts only APP/HEARTBEAT/SNAP when the
    receiver knows no members ("dropped PRE_VOTE from non-member 1"). 2 cannot campaign (not
    a voter in its own, empty, view): no leader, ever. (Before the current working-tree
    change, `_accept_sender` accepted any sender when `members` was empty.)"""
    c = Cluster(1, joiners=[2])
    c.campaign(1)
    c.block(1, 2)
    c.conf_change(1, ConfChangeType.ADD_VOTER, 2)
    c.deliver_all()
    assert sorted(c[1].conf.voters) == [1, 2]
    c.crash(1)
    c.restart(1)
    c.heal()
    for _ in range(30 * ELECTION):
        c[1].tick()
        c[2].tick()
        c.deliver_all()
    assert c.leader() == 1  # fails: None; 2 logs "dropped PRE_VOTE from non-member 1"


def test_second_conf_change_refused_while_one_is_pending() -> None:
    c = Cluster(3, joiners=[4, 5])
    c.campaign(1)
    while c[1].role is not Role.LEADER:
        c.deliver_round()
    # Right after the election: not before the empty entry of the term is applied.
    with pytest.raises(ProposalDropped, match="pending"):
        c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    with pytest.raises(ProposalDropped, match="pending") as exc:
        c.conf_change(1, ConfChangeType.ADD_LEARNER, 5)
    assert exc.value.leader == 1
    c.deliver_all()
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 5)  # accepted once the first applied
    c.deliver_all()
    assert sorted(c[1].conf.learners) == [4, 5]


def test_invalid_conf_changes_refused() -> None:
    c = elected()
    with pytest.raises(ProposalDropped, match="not a member"):
        c.conf_change(1, ConfChangeType.REMOVE, 7)
    with pytest.raises(ProposalDropped, match="already a voter"):
        c.conf_change(1, ConfChangeType.ADD_VOTER, 2)
    with pytest.raises(ProposalDropped, match="already a voter"):
        c.conf_change(1, ConfChangeType.ADD_LEARNER, 2)
    one = elected(1)
    with pytest.raises(ProposalDropped, match="last voter"):
        one.conf_change(1, ConfChangeType.REMOVE, 1)


# ---------------------------------------------------------------------------- ReadIndex
def test_read_index_single_node_is_immediate() -> None:
    c = Cluster(1)
    c.campaign(1)
    out = c.read_index(1, b"r1")
    assert "1 read: index=2 ctx=r1" in out
    assert c.nodes[1].read_states == [ReadState(2, b"r1")]


def test_read_index_needs_a_heartbeat_quorum() -> None:
    c = elected()
    c.isolate(1)
    out = c.read_index(1, b"r1")
    assert [line for line in out if "HEARTBEAT" in line] == [
        "1->2 HEARTBEAT term=2 commit=4 ctx=r1 (dropped)",
        "1->3 HEARTBEAT term=2 commit=4 ctx=r1 (dropped)",
    ]
    c.deliver_all()
    assert c.nodes[1].read_states == []
    # A later heartbeat repeats the context; one follower's answer makes a quorum.
    c.partition([1, 2], [3])
    c.tick(1)
    c.deliver_all()
    assert c.nodes[1].read_states == [ReadState(4, b"r1")]


def test_read_index_answers_earlier_requests_in_order() -> None:
    c = elected()
    c.block(2, 1, [MsgType.HEARTBEAT_RESP])
    c.block(3, 1, [MsgType.HEARTBEAT_RESP])
    c.read_index(1, b"a")
    c.propose(1, b"x")
    c.deliver_all()
    c.read_index(1, b"b")
    c.deliver_all()
    assert c.nodes[1].read_states == []
    c.heal()
    c.tick(1)  # carries the latest context, "b": its quorum confirms "a" too
    c.deliver_all()
    assert c.nodes[1].read_states == [ReadState(4, b"a"), ReadState(5, b"b")]


def test_read_index_new_leader_waits_for_a_commit_in_its_term() -> None:
    c = Cluster(3)
    c.campaign(1)
    while c[1].role is not Role.LEADER:
        c.deliver_round()
    assert c[1].log.committed == 3  # the empty entry 4@2 is not committed yet
    out = c.read_index(1, b"r")
    assert not [line for line in out if "ctx=r" in line]  # deferred: no heartbeat yet
    start = len(c.sent)
    c.deliver_all()
    with_ctx = [i for i, m in enumerate(c.sent[start:]) if m.context == b"r"]
    assert with_ctx
    assert c.nodes[1].read_states == [ReadState(4, b"r")]


def test_read_index_from_follower_is_forwarded() -> None:
    c = elected()
    out = c.read_index(2, b"f1")
    assert out == ["2->1 READ_INDEX term=2 ctx=f1"]
    c.deliver_all()
    assert c.nodes[2].read_states == [ReadState(4, b"f1")]
    assert c.nodes[1].read_states == []
    assert sent_since(c, 0, type=MsgType.READ_INDEX_RESP, to=2)


def test_read_index_without_leader_is_refused() -> None:
    c = Cluster(3)
    with pytest.raises(ProposalDropped, match="no leader"):
        c[2].read_index(b"x")


# ---------------------------------------------------------------------------- transfer
def test_transfer_to_caught_up_follower() -> None:
    c = elected()
    out = c.transfer(1, 2)
    assert out == ["1->2 TIMEOUT_NOW term=2"]
    with pytest.raises(ProposalDropped, match="transfer in progress"):
        c[1].propose([b"x"])
    c.deliver_all()
    assert c.leader() == 2
    assert c[2].term == 3
    assert c[1].role is Role.FOLLOWER
    assert c[1].lead == 2
    # 2 skipped pre-vote and 3 voted despite its lease on 1.
    assert sent_since(c, 0, frm=2, type=MsgType.VOTE)
    assert not sent_since(c, 0, frm=2, type=MsgType.PRE_VOTE)
    c.propose(2, b"new")
    c.deliver_all()
    assert c.nodes[1].sm.data() == [b"new"]


def test_transfer_to_lagging_follower_catches_it_up_first() -> None:
    c = elected()
    c.block(1, 3)
    for i in range(5):
        c.propose(1, f"v{i}".encode())
    c.deliver_all()
    c.heal()
    assert c[3].log.last_index() == 4
    start = len(c.sent)
    out = c.transfer(1, 3)
    assert not [line for line in out if "TIMEOUT_NOW" in line]
    c.deliver_all()
    timeout_now = sent_since(c, start, type=MsgType.TIMEOUT_NOW)
    assert [(m.frm, m.to) for m in timeout_now] == [(1, 3)]
    assert c.leader() == 3
    assert c.nodes[3].sm.data()[:5] == [f"v{i}".encode() for i in range(5)]
    assert_logs_match(c, [1, 2, 3])


def test_transfer_times_out_and_proposals_resume() -> None:
    c = elected()
    c.block(1, 2)
    c.block(2, 1)
    out = c.transfer(1, 2)
    assert out == ["1->2 TIMEOUT_NOW term=2 (dropped)"]
    out = c.tick(1, ELECTION)
    assert "1 note: leadership transfer to 2 timed out" in out
    c.heal()
    c.propose(1, b"ok")
    c.deliver_all()
    assert c.leader() == 1
    assert c.nodes[2].sm.data() == [b"ok"]


def test_transfer_refusals() -> None:
    c = elected()
    with pytest.raises(ProposalDropped, match="not the leader"):
        c[2].transfer_leadership(3)
    with pytest.raises(ProposalDropped, match="not a voter"):
        c[1].transfer_leadership(9)
    c[1].transfer_leadership(1)  # to itself: nothing to do
    assert c.process(1) == []


# ---------------------------------------------------------------------------- sender filter
def test_message_from_non_member_is_dropped_and_noted() -> None:
    c = elected()
    core = c[1]
    core.step(Message(MsgType.PRE_VOTE, 1, 9, term=5, log_term=9, index=100))
    out = c.process(1)
    assert out == ["1 note: dropped PRE_VOTE from non-member 9"]
    assert (core.role, core.term) == (Role.LEADER, 2)
    c[2].step(Message(MsgType.VOTE, 2, 9, term=5, log_term=9, index=100))
    assert c.process(2) == ["2 note: dropped VOTE from non-member 9"]
    assert c[2].term == 2


def test_misaddressed_message_is_dropped_and_noted() -> None:
    c = elected()
    c[1].step(Message(MsgType.HEARTBEAT, 3, 2, term=2))
    assert c.process(1) == ["1 note: dropped HEARTBEAT from 2 to 3: misaddressed"]


def test_unknown_leader_append_is_accepted_by_a_joiner() -> None:
    # A node that has not yet learned the membership accepts the leader's messages.
    c = Cluster(3, joiners=[4])
    c.elect(1)
    c.deliver_all()
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    assert c[4].lead == 1
    assert c[4].log.committed == c[1].log.committed


# ---------------------------------------------------------------------------- restart
def test_restart_preserves_term_vote_log_and_rederives_membership() -> None:
    c = Cluster(3, joiners=[4])
    c.elect(1)
    c.deliver_all()
    c.propose(1, b"a")
    c.deliver_all()
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    c.propose(1, b"b")
    c.deliver_all()
    for nid in (1, 2):
        before = c[nid]
        hs, ents = before.hard_state(), list(before.log.entries)
        conf = before.conf
        c.crash(nid)
        c.restart(nid)
        after = c[nid]
        assert after is not before
        assert after.hard_state() == hs == HardState(2, 1, 7)
        assert after.log.entries == ents
        assert after.conf == conf
        assert sorted(after.conf.learners) == [4]
        assert after.role is Role.FOLLOWER
        assert after.lead == 0
        assert c.process(nid) == []  # nothing to persist, nothing re-applied
    # The cluster carries on (1 is a follower now; someone wins term 3).
    lead = c.tick_until_leader([1, 2, 3])
    c.propose(lead, b"c")
    c.deliver_all()
    assert c.nodes[4].sm.data() == [b"a", b"b", b"c"]


def test_restart_with_unapplied_committed_entries_reapplies_them() -> None:
    c = elected()
    c.propose(1, b"a", b"b")
    c.deliver_all()
    c.crash(2)
    c.nodes[2].sm = StateMachine()  # the state machine lost everything
    c.restart(2)
    rd = c[2].ready()
    assert [e.index for e in rd.committed] == [1, 2, 3, 4, 5, 6]
    c[2].advance(rd)
    assert not c[2].has_ready()
    assert sorted(c[2].conf.voters) == [1, 2, 3]


def test_restart_from_snapshot_derives_membership_from_meta_and_tail() -> None:
    c = Cluster(3, joiners=[4])
    c.elect(1)
    c.deliver_all()
    c.compact(2)  # membership {1,2,3} captured in the snapshot
    c.conf_change(1, ConfChangeType.ADD_LEARNER, 4)
    c.deliver_all()
    c.crash(2)
    disk = c.nodes[2].disk
    assert sorted(disk.snapshot.meta.conf.voters) == [1, 2, 3]
    assert not disk.snapshot.meta.conf.learners
    c.restart(2)
    assert sorted(c[2].conf.learners) == [4]  # replayed from the log after the snapshot


def test_restart_from_snapshot_only_disk() -> None:
    c = elected()
    c.compact(3)
    c.crash(3)
    assert isinstance(c.nodes[3].disk.snapshot, Snapshot)
    assert c.nodes[3].disk.snapshot.meta == SnapshotMeta(4, 2, c[1].conf)
    c.restart(3)
    assert c[3].log.first_index() == 5


# ---------------------------------------------------------------------------- forwarding
def test_forwarded_duplicates_are_dropped_within_a_bounded_window(monkeypatch: Any) -> None:
    monkeypatch.setattr(core_module, "FORWARD_DEDUP_BYTES", 3000)
    c = elected(3, leader=1)
    leader = c[1]
    last = leader.log.last_index()
    big = [bytes([i]) * 1000 for i in range(5)]
    for data in big:
        c[2].forward([data])
    c.deliver_all()
    assert leader.log.last_index() == last + 5
    assert leader.forwarded_bytes <= 3000
    assert list(leader.forwarded) == big[2:]  # the oldest went first
    # A forward delivered again is dropped while remembered; once forgotten it would not be.
    again = Message(
        MsgType.PROP, 1, 2, leader.term, entries=[Entry(0, 0, EntryType.NORMAL, big[4])]
    )
    leader.step(again)
    assert leader.log.last_index() == last + 5
