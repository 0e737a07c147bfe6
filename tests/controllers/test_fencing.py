"""Fencing (orchestrator/store/fencing.py): a deposed leader's fenced writes fail.

Three real `RaftNode`s + `RaftStore`s in one trio run, talking TCP over loopback. The leader of
term T makes a fenced write (it lands), then hands leadership to another server; afterwards the
same write fenced to T fails on the old leader (no longer leader) and on the new one (another
term), through the store and through the in-process API client, while unfenced writes still
work from any server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from storekit import raft_stores

from orchestrator.apiserver.resources import Api
from orchestrator.apiserver.storage import ObjectStore
from orchestrator.controllers.runtime.client import NAMESPACES
from orchestrator.controllers.runtime.inprocess import InProcessClient
from orchestrator.kube.errors import ApiError
from orchestrator.kube.schema.builtin import builtin_registry
from orchestrator.security.authn import User
from orchestrator.store.fencing import Fenced, current_fence, fenced
from orchestrator.store.raftstore import RaftStore

CONTROLLER = User("system:kube-controller-manager", ("system:authenticated",))


async def leader_of(stores: dict[int, RaftStore], *, other_than: int = 0) -> int:
    while True:
        for nid, s in stores.items():
            if nid != other_than and s.node.is_leader:
                return nid
        await trio.sleep(0.01)


def test_fenced_is_a_no_op_without_a_term() -> None:
    with fenced(None):
        assert current_fence() is None
    with fenced(7):
        assert current_fence() == 7
        with fenced(8):
            assert current_fence() == 8
        with fenced(None):  # no term: the enclosing fence still holds
            assert current_fence() == 7
        assert current_fence() == 7
    assert current_fence() is None
    with pytest.raises(KeyError), fenced(9):
        raise KeyError  # an error leaves the block unfenced too
    assert current_fence() is None


async def test_a_deposed_leaders_fenced_writes_fail(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with raft_stores(tmp_path, 3) as stores:
            old = await leader_of(stores)
            is_leader, term = stores[old].node.leadership()
            assert is_leader
            with fenced(term):
                await stores[old].create("/k/before", b"1")  # leader of `term`: lands
            api = Api(ObjectStore(stores[old]), builtin_registry())
            client = InProcessClient(api, CONTROLLER, fence_term=term)
            await client.create(NAMESPACES, {"metadata": {"name": "made-in-term"}})

            await stores[old].node.transfer_leadership(old % 3 + 1)
            new = await leader_of(stores, other_than=old)
            while stores[old].node.leadership()[1] == term:  # the old leader learns the term
                await stores[old].node.wait_role_change()

            for nid in (old, new):
                with fenced(term), pytest.raises(Fenced):
                    await stores[nid].create("/k/after", b"2")
            with pytest.raises(ApiError) as info:
                await client.create(NAMESPACES, {"metadata": {"name": "made-after"}})
            assert info.value.code == 503
            assert "fenced" in info.value.message

            # Nothing fenced landed; unfenced writes still work from any server.
            assert await stores[new].get("/k/after") is None
            await stores[old].create("/k/unfenced", b"3")
            _, new_term = stores[new].node.leadership()
            with fenced(new_term):
                await stores[new].create("/k/new-term", b"4")
            assert (await stores[new].get("/k/before")) is not None
