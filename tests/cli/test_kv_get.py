"""`orchestrator kv get`: text when the value is text, exact bytes with `-o json`, else a hint.

`print_value` is tested directly; the command's wiring (`-o json`, `--stale`, exit status) runs
through the CLI's parser and `_client_command` against a fake store client (no server).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack
import pytest
import trio
from pkikit import server_pki

from orchestrator.cli import main as cli
from orchestrator.cli.kvget import print_value
from orchestrator.store.types import KeyValue


def show(value: bytes, output: str = "text", key: str = "/a") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = print_value(KeyValue(key, value, 2, 5, 3), output, out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (b"hello world", "hello world\n"),
        ("grüße, 世界 ✓".encode(), "grüße, 世界 ✓\n"),
        (b"two\nlines\n", "two\nlines\n"),  # ends with a newline: none added
        (b"a\tb", "a\tb\n"),
        (b"", "\n"),
    ],
)
def test_utf8_text_is_printed_as_text(value: bytes, shown: str) -> None:
    assert show(value) == (0, shown, "")


def test_a_stored_object_is_not_printed_but_explained() -> None:
    packed = msgpack.packb({"kind": "Secret", "data": {"k": b"\xff\x00"}}, use_bin_type=True)
    rc, out, err = show(packed, key="/registry/core/secrets/default/s")
    assert (rc, out) == (1, "")
    assert err == (
        f"error: the value of /registry/core/secrets/default/s is {len(packed)} bytes that are "
        "not UTF-8 text (the API server stores objects as msgpack: read them with "
        "`orchestrator get`); add -o json for its exact bytes\n"
    )


def test_binary_outside_the_registry_gets_the_short_hint() -> None:
    rc, out, err = show(b"\xed\xa0\x80\xff", key="/bin")
    assert (rc, out) == (1, "")
    assert err == (
        "error: the value of /bin is 4 bytes that are not UTF-8 text; "
        "add -o json for its exact bytes\n"
    )


@pytest.mark.parametrize("value", [b"\x1b[2J\x1b[31mred", b"a\rb", "x\u009bz".encode(), b"\x7f"])
def test_text_with_control_characters_is_not_sent_to_the_terminal(value: bytes) -> None:
    rc, out, err = show(value)
    assert (rc, out) == (1, "")
    assert err.startswith("error: the value of /a is text with control characters")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "value", [b"hello", b"\x85\xa4kind\xa6Secret\xff", b"\x1b[31m\x7f\xc2\x9b", "é".encode()]
)
def test_json_is_the_exact_bytes_and_revisions(value: bytes) -> None:
    rc, out, err = show(value, "json")
    assert (rc, err) == (0, "")
    assert out.count("\n") == 1
    assert out.endswith("\n")
    assert not any(0x7F <= ord(c) <= 0x9F or ord(c) < 0x20 for c in out[:-1])  # all escaped
    doc = json.loads(out)
    assert base64.b64decode(doc.pop("value_base64")) == value
    try:
        text: str | None = value.decode()
    except UnicodeDecodeError:
        text = None
    assert doc == {
        "key": "/a",
        "value": text,
        "create_revision": 2,
        "mod_revision": 5,
        "version": 3,
    }


class FakeStoreClient:
    """Stands in for `StoreClient`: one key, and what `get_kv` was asked."""

    values: dict[str, KeyValue] = {}
    asked: list[tuple[str, bool]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def __aenter__(self) -> FakeStoreClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def get_kv(self, key: str, *, linearizable: bool = True) -> KeyValue | None:
        await trio.lowlevel.checkpoint()
        self.asked.append((key, linearizable))
        return self.values.get(key)


@pytest.fixture
def fake_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> type[FakeStoreClient]:
    from orchestrator.store import client

    global _DATA_DIR
    _DATA_DIR = tmp_path_factory.mktemp("server")
    server_pki(_DATA_DIR, 1)  # the admin certificate the command loads (nothing dials)

    FakeStoreClient.values = {"/t": KeyValue("/t", "é ok".encode(), 7, 9, 2)}
    FakeStoreClient.asked = []
    monkeypatch.setattr(client, "StoreClient", FakeStoreClient)
    return FakeStoreClient


_DATA_DIR = Path()


def run_cli(*argv: str) -> int:
    creds = ["--data-dir", str(_DATA_DIR), "--endpoints", "127.0.0.1:1"]
    args = cli._build_parser().parse_args([*argv, *creds])
    return int(trio.run(cli._client_command, args))


def test_kv_get_command_prints_text_or_json(
    fake_store: type[FakeStoreClient], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("kv", "get", "/t") == 0
    assert capsys.readouterr().out == "é ok\n"
    assert run_cli("kv", "get", "/t", "--stale", "-o", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["value"], doc["mod_revision"]) == ("é ok", 9)
    assert fake_store.asked == [("/t", True), ("/t", False)]
    assert run_cli("kv", "get", "/missing") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == "error: key '/missing' not found"
