"""A listener that cannot bind stops start-up with one line naming the flag and the port.

Unit tests of `orchestrator.listenerrors` (which errors are translated, which pass through), and a
process test per listener of `orchestrator server` (`--peer-listen`, `--client-listen`,
`--listen`): the port is held by a socket of this test, the server exits with status 1 and its
stderr holds one `error:` line naming the flag and the port, and no traceback.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from cluster import HOST, free_ports

from orchestrator.listenerrors import ListenerError, naming_listener


def _taken() -> OSError:
    return OSError(errno.EADDRINUSE, "Address already in use")


def test_a_taken_port_becomes_one_line_naming_flag_and_port() -> None:
    with pytest.raises(ListenerError) as caught, naming_listener("--client-listen", "0.0.0.0:7101"):
        raise _taken()
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("--client-listen 0.0.0.0:7101: port 7101 is already in use")
    assert line.endswith("choose another port with --client-listen")
    assert isinstance(caught.value.__cause__, OSError)


def test_a_bind_failure_inside_nested_nurseries_is_translated() -> None:
    async def bind_fails() -> None:
        async def inner() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                raise _taken()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(inner)

    async def main() -> None:
        with naming_listener("--peer-listen", "10.0.0.1:7001"):
            await bind_fails()

    with pytest.raises(ListenerError, match=r"^--peer-listen 10\.0\.0\.1:7001: port 7001 "):
        trio.run(main)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (errno.EADDRNOTAVAIL, "address 192.0.2.1 is not one of this machine's addresses"),
        (errno.EACCES, "no permission to listen on port 80"),
    ],
)
def test_other_bind_failures_say_what_is_wrong(code: int, says: str) -> None:
    with pytest.raises(ListenerError, match=says), naming_listener("--listen", "192.0.2.1:80"):
        raise OSError(code, os.strerror(code))


def test_a_listen_host_that_does_not_resolve_is_one_line() -> None:
    with pytest.raises(ListenerError) as caught, naming_listener("--listen", "nohost.invalid:6443"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert str(caught.value) == (
        "--listen nohost.invalid:6443: host nohost.invalid does not resolve (Name or service "
        "not known); give an address of this machine with --listen"
    )


def test_other_errors_pass_through_unchanged() -> None:
    with pytest.raises(OSError, match="disk") as caught, naming_listener("--listen", "h:1"):
        raise OSError(errno.EIO, "disk")
    assert not isinstance(caught.value, ListenerError)
    # an unwritable data dir is EACCES too, but a file's: it keeps its own message
    with (
        pytest.raises(PermissionError, match="data/kubeconfig"),
        naming_listener("--listen", "h:1"),
    ):
        raise PermissionError(errno.EACCES, "Permission denied", "data/kubeconfig")
    with pytest.raises(KeyError), naming_listener("--listen", "h:1"):
        raise KeyError("x")
    # a group that holds a bind failure and something else keeps both (a real bug stays seen)
    mixed = ExceptionGroup("two", [_taken(), ValueError("bug")])
    with pytest.raises(ExceptionGroup) as group, naming_listener("--listen", "h:1"):
        raise mixed
    assert group.value is mixed


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port a listening socket of this test holds (no SO_REUSEADDR tricks: taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--peer-listen", "--client-listen", "--listen"])
def test_server_port_clash_is_one_line_and_status_1(
    tmp_path: Path, held_port: int, flag: str
) -> None:
    addresses = {
        f: f"{HOST}:{p}"
        for f, p in zip(
            ("--peer-listen", "--client-listen", "--listen"), free_ports(3), strict=True
        )
    }
    addresses[flag] = f"{HOST}:{held_port}"
    argv = [sys.executable, "-m", "orchestrator", "--log-level", "warning", "server"]
    argv += ["--data-dir", str(tmp_path / "data"), "--no-agent"]
    argv += [part for pair in addresses.items() for part in pair]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    # stderr: the two start-up notes (join token, kubeconfig), then the error; no traceback
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {flag} {HOST}:{held_port}: port {held_port} is already in use (by another "
        f"process, or by another listener of this one); free it or choose another port with {flag}"
    ], done.stderr
    assert done.stderr.splitlines()[-1] == errors[0]
    assert "Traceback" not in done.stderr
    assert "ExceptionGroup" not in done.stderr


def test_a_listener_error_built_by_hand_from_another_error_still_reads() -> None:
    error = ListenerError("--kubelet-port", "10.0.0.5:10250", OSError(errno.ENOBUFS, "No buffer"))
    assert str(error) == (
        "--kubelet-port 10.0.0.5:10250: cannot listen there (No buffer); "
        "choose another address with --kubelet-port"
    )
