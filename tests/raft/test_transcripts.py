"""Transcript tests of the Raft core, in the style of etcd-io/raft's interaction tests.

Each `testdata/*.txt` file is a script: a command line, a `----` line, then the output that
command is expected to produce, ended by a blank line. Lines starting with `#` before a command
are comments. The test replays the script against `harness.Cluster` and compares every block;
`pytest tests/raft/test_transcripts.py --rewrite` regenerates the expected output instead (review
the diff before committing it). Output lines are the harness' one-line renderings: Ready items
(`1 state: ...`, `1 hard: ...`, `1 persist: ...`, `1 apply: ...`, `1 read: ...`, `1 note: ...`)
and messages (`1->2 APP term=2 log=1/3 commit=3 entries=[2/4 2/5]`, suffixed `(dropped)` when
the network drops it at send time).

Commands (N, M are node ids; `xK` repeats):

    cluster 3 [joiners=4,5] [seed=0] [election_tick=10 pre_vote=false ...]   new cluster
    campaign N | tick N [xK] | propose N data... | read N ctx | transfer N M
    down N M                                     tell N that M's process is gone
    conf N add-learner|add-voter|remove M        a membership change on N
    deliver [xK]                                 K rounds of delivery (default: until quiet)
    partition 1 2 / 3 | isolate N | block N->M [TYPE...] | heal
    crash N | restart N | add-node N | compact N [keep=K]
    status [N...] | log N
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import (
    Cluster,
    describe,
    describe_conf,
    describe_entry,
    describe_message,
    describe_status,
)

from orchestrator.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    HardState,
    Message,
    MsgType,
    ProposalDropped,
    Ready,
)

TESTDATA = Path(__file__).parent / "testdata"


# ---------------------------------------------------------------------------- script format
@dataclass
class Block:
    comments: list[str]
    command: str
    expected: list[str]
    line: int  # 1-based line of the command


def parse(text: str, name: str = "<script>") -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    comments: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            if line.startswith("#"):
                comments.append(line)
            i += 1
            continue
        start = i + 1
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ValueError(f"{name}:{start}: expected '----' after command {line!r}")
        i += 2
        expected: list[str] = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append(Block(comments, line, expected, start))
        comments = []
    return blocks


def render(blocks: list[Block], outputs: list[list[str]]) -> str:
    parts = [
        "\n".join([*b.comments, b.command, "----", *out])
        for b, out in zip(blocks, outputs, strict=True)
    ]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- interpreter
class ScriptError(Exception):
    pass


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise ScriptError(f"expected a number, got {s!r}") from None


def _value(s: str) -> object:
    if s in ("true", "false"):
        return s == "true"
    return _int(s)


def _split_repeat(args: list[str]) -> tuple[list[str], int]:
    if args and args[-1].startswith("x") and args[-1][1:].isdigit():
        return args[:-1], int(args[-1][1:])
    return args, 1


class Interpreter:
    def __init__(self) -> None:
        self._c: Cluster | None = None
        self.commands: dict[str, Callable[[list[str]], list[str]]] = {
            "cluster": self.cmd_cluster,
            "campaign": lambda a: self.c.campaign(_int(a[0])),
            "tick": self.cmd_tick,
            "propose": self.cmd_propose,
            "read": lambda a: self._refusable(lambda: self.c.read_index(_int(a[0]), a[1].encode())),
            "transfer": lambda a: self._refusable(lambda: self.c.transfer(_int(a[0]), _int(a[1]))),
            "down": lambda a: self.c.report_down(_int(a[0]), _int(a[1])),
            "conf": self.cmd_conf,
            "deliver": self.cmd_deliver,
            "partition": self.cmd_partition,
            "isolate": lambda a: self._do(lambda: self.c.isolate(_int(a[0]))),
            "block": self.cmd_block,
            "heal": lambda a: self._do(self.c.heal),
            "crash": lambda a: self._do(lambda: self.c.crash(_int(a[0]))),
            "restart": self.cmd_restart,
            "add-node": lambda a: self._do(lambda: self.c.add_node(_int(a[0]))),
            "compact": self.cmd_compact,
            "status": self.cmd_status,
            "log": self.cmd_log,
        }

    @property
    def c(self) -> Cluster:
        if self._c is None:
            raise ScriptError("no cluster: start the script with `cluster N`")
        return self._c

    @staticmethod
    def _do(fn: Callable[[], object]) -> list[str]:
        fn()
        return []

    @staticmethod
    def _refusable(fn: Callable[[], list[str]]) -> list[str]:
        try:
            return fn()
        except ProposalDropped as exc:
            return [f"refused: {exc.reason} (leader={exc.leader})"]

    def run(self, command: str) -> list[str]:
        words = command.split()
        fn = self.commands.get(words[0])
        if fn is None:
            raise ScriptError(f"unknown command {words[0]!r}")
        try:
            out = fn(words[1:])
        except IndexError:
            raise ScriptError(f"missing argument in {command!r}") from None
        return out or ["ok"]

    # ---------------------------------------------------------------- commands
    def cmd_cluster(self, args: list[str]) -> list[str]:
        n = _int(args[0])
        kw: dict[str, object] = {}
        joiners: list[int] = []
        seed = 0
        for a in args[1:]:
            key, _, val = a.partition("=")
            if key == "joiners":
                joiners = [_int(v) for v in val.split(",")]
            elif key == "seed":
                seed = _int(val)
            else:
                kw[key] = _value(val)
        self._c = Cluster(n, seed=seed, joiners=joiners, **kw)
        return self._c.process_all()

    def cmd_tick(self, args: list[str]) -> list[str]:
        """Tick (and process) one tick at a time; a run of ticks with identical output is
        printed once, each line suffixed with `(xK)`."""
        args, k = _split_repeat(args)
        nid = _int(args[0])
        runs: list[tuple[list[str], int]] = []
        for _ in range(k):
            out = self.c.tick(nid)
            if runs and runs[-1][0] == out:
                runs[-1] = (out, runs[-1][1] + 1)
            else:
                runs.append((out, 1))
        return [line if n == 1 else f"{line} (x{n})" for out, n in runs for line in out]

    def cmd_propose(self, args: list[str]) -> list[str]:
        nid = _int(args[0])
        try:
            index, term = self.c[nid].propose([a.encode() for a in args[1:]])
        except ProposalDropped as exc:
            return [f"refused: {exc.reason} (leader={exc.leader})"]
        return [f"proposed at {term}/{index}", *self.c.process(nid)]

    def cmd_conf(self, args: list[str]) -> list[str]:
        nid, kind, target = _int(args[0]), args[1], _int(args[2])
        kinds = {t.name.lower().replace("_", "-"): t for t in ConfChangeType}
        if kind not in kinds:
            raise ScriptError(f"unknown conf change {kind!r}; one of {sorted(kinds)}")
        try:
            index, term = self.c[nid].propose_conf_change(ConfChange(kinds[kind], target))
        except ProposalDropped as exc:
            return [f"refused: {exc.reason} (leader={exc.leader})"]
        return [f"proposed at {term}/{index}", *self.c.process(nid)]

    def cmd_deliver(self, args: list[str]) -> list[str]:
        _, k = _split_repeat(args)
        if not args:
            return self.c.deliver_all()
        out: list[str] = []
        for _ in range(k):
            out.extend(self.c.deliver_round())
        return out

    def cmd_partition(self, args: list[str]) -> list[str]:
        groups: list[list[int]] = [[]]
        for a in args:
            if a == "/":
                groups.append([])
            else:
                groups[-1].append(_int(a))
        self.c.partition(*groups)
        return []

    def cmd_block(self, args: list[str]) -> list[str]:
        frm, sep, to = args[0].partition("->")
        if not sep:
            raise ScriptError("block wants N->M (either may be *)")
        types = [MsgType[t] for t in args[1:]] or None
        self.c.block(None if frm == "*" else _int(frm), None if to == "*" else _int(to), types)
        return []

    def cmd_restart(self, args: list[str]) -> list[str]:
        nid = _int(args[0])
        self.c.restart(nid)
        return [*describe_status(self.c[nid])[:1], *self.c.process(nid)]

    def cmd_compact(self, args: list[str]) -> list[str]:
        nid = _int(args[0])
        keep = 0
        for a in args[1:]:
            key, _, val = a.partition("=")
            if key != "keep":
                raise ScriptError(f"unknown compact option {a!r}")
            keep = _int(val)
        meta = self.c.compact(nid, keep)
        log = self.c[nid].log
        return [
            f"{nid} snapshot at {meta.term}/{meta.index} {describe_conf(meta.conf)}; "
            f"log=[{log.first_index()},{log.last_index()}]"
        ]

    def cmd_status(self, args: list[str]) -> list[str]:
        ids = [_int(a) for a in args] or sorted(self.c.nodes)
        out: list[str] = []
        for nid in ids:
            if not self.c.nodes[nid].alive:
                out.append(f"{nid}: down")
            else:
                out.extend(describe_status(self.c[nid]))
        return out

    def cmd_log(self, args: list[str]) -> list[str]:
        nid = _int(args[0])
        node = self.c.nodes[nid]
        log = self.c[nid].log
        snap = f"snap={log.offset_term}/{log.offset} " if log.offset else ""
        ents = " ".join(describe_entry(e) for e in log.entries) or "(empty)"
        applied = " ".join(d.decode("utf-8", "backslashreplace") for d in node.sm.data())
        return [f"{nid}: log {snap}{ents}", f"{nid}: applied [{applied}]"]


# ---------------------------------------------------------------------------- the test
def replay(blocks: list[Block], name: str) -> list[list[str]]:
    interp = Interpreter()
    outputs = []
    for b in blocks:
        try:
            outputs.append(interp.run(b.command))
        except ScriptError as exc:
            raise AssertionError(f"{name}:{b.line}: {b.command}: {exc}") from None
    return outputs


SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_transcript(path: Path, request: pytest.FixtureRequest) -> None:
    text = path.read_text()
    blocks = parse(text, path.name)
    outputs = replay(blocks, path.name)
    actual = render(blocks, outputs)
    if request.config.getoption("--rewrite", default=False):
        if actual != text:
            path.write_text(actual)
        return
    for b, out in zip(blocks, outputs, strict=True):
        if out != b.expected:
            diff = "\n".join(
                difflib.unified_diff(
                    text.splitlines(),
                    actual.splitlines(),
                    f"{path.name} (expected)",
                    f"{path.name} (actual)",
                    lineterm="",
                    n=2,
                )
            )
            pytest.fail(
                f"{path.name}:{b.line}: output of {b.command!r} differs "
                f"(rerun with --rewrite to accept):\n{diff}",
                pytrace=False,
            )


def test_replay_is_deterministic() -> None:
    for path in SCRIPTS:
        blocks = parse(path.read_text(), path.name)
        assert replay(blocks, path.name) == replay(blocks, path.name), path.name


def test_parse_render_roundtrip() -> None:
    text = "# c\ncampaign 1\n----\na\nb\n\n# d\n\ndeliver\n----\nok\n"
    blocks = parse(text)
    assert [(b.comments, b.command, b.expected, b.line) for b in blocks] == [
        (["# c"], "campaign 1", ["a", "b"], 2),
        (["# d"], "deliver", ["ok"], 9),
    ]
    assert render(blocks, [b.expected for b in blocks]) == (
        "# c\ncampaign 1\n----\na\nb\n\n# d\ndeliver\n----\nok\n"
    )
    with pytest.raises(ValueError, match="expected '----'"):
        parse("campaign 1\nok\n")


def test_describe_renders_one_line_per_item() -> None:
    app = Message(
        MsgType.APP,
        2,
        1,
        term=2,
        log_term=1,
        index=3,
        commit=3,
        entries=[Entry(2, 4), Entry(2, 5, data=b"x")],
    )
    assert describe_message(app) == "1->2 APP term=2 log=1/3 commit=3 entries=[2/4 2/5]"
    rej = Message(MsgType.APP_RESP, 1, 2, term=2, index=5, reject=True, reject_hint=3, log_term=1)
    assert describe_message(rej) == "2->1 APP_RESP term=2 index=5 rejected hint=1/3"
    rd = Ready(
        hard_state=HardState(2, 1, 3),
        entries=[Entry(2, 4), Entry(2, 5, data=b"x")],
        committed=[Entry(2, 4)],
        messages=[app],
        notes=["hello"],
    )
    assert describe(rd) == "\n".join(
        [
            "1 hard: term=2 vote=1 commit=3",
            "1 persist: 2/4 2/5:x",
            "1 apply: 2/4",
            "1 note: hello",
            "1->2 APP term=2 log=1/3 commit=3 entries=[2/4 2/5]",
        ]
    )
