"""A listener that cannot bind, said in one line that names the flag and the address.

A bind failure (`OSError` from `open_tcp_listeners`) is raised deep inside nested nurseries, so
it reaches the user as a nested `ExceptionGroup` traceback of 70 lines. Wrap the start of one
listener in `naming_listener(flag, address)`: a bind failure raised inside it, bare or as the
only kind of leaf of exception groups, becomes a `ListenerError` whose `str()` is the one line
the CLI prints (`error: <line>`) before it exits with status 1.

    with naming_listener("--client-listen", opts.client_listen):
        await nursery.start(service.run)

Invariants: only the bind errors named in `_REASONS` (port taken, address not on this machine,
a privileged port) and a listen host that does not resolve are translated; only socket errors
(no file name: an unwritable data dir is EACCES too and keeps its own message); and only when
every leaf of the group is one of them. Any other exception, or a group that also holds
something else, passes through unchanged, so a real bug keeps its traceback. The original
error stays reachable as `__cause__`.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ListenerError", "bind_error", "naming_listener"]

# errno -> what it means for a listener, and what to do ({host}, {port}, {flag} filled in).
_REASONS: dict[int, str] = {
    errno.EADDRINUSE: (
        "port {port} is already in use (by another process, or by another listener of this one); "
        "free it or choose another port with {flag}"
    ),
    errno.EADDRNOTAVAIL: (
        "address {host} is not one of this machine's addresses; give one of its own "
        "(or 0.0.0.0) with {flag}"
    ),
    errno.EACCES: (
        "no permission to listen on port {port} (ports below 1024 need root or "
        "CAP_NET_BIND_SERVICE); choose another port with {flag}"
    ),
}
_OTHER = "cannot listen there ({why}); choose another address with {flag}"  # built by hand
_UNRESOLVED = "host {host} does not resolve ({why}); give an address of this machine with {flag}"


class ListenerError(Exception):
    """A listener could not bind `address`, the value of command-line flag `flag`; `cause` is
    the bind failure (`bind_error`)."""

    def __init__(self, flag: str, address: str, cause: OSError) -> None:
        self.flag = flag
        self.address = address
        self.cause = cause
        host, _, port = address.rpartition(":")
        unresolved = isinstance(cause, socket.gaierror)
        template = _UNRESOLVED if unresolved else _REASONS.get(cause.errno or 0, _OTHER)
        reason = template.format(
            host=host or address, port=port or address, flag=flag, why=cause.strerror
        )
        super().__init__(f"{flag} {address}: {reason}")


def bind_error(exc: BaseException) -> OSError | None:
    """`exc` if it is a bind failure `naming_listener` translates (module doc), else None."""
    if isinstance(exc, socket.gaierror):  # the listen address's host name does not resolve
        return exc
    # A file operation's error carries its path (a data dir we may not write is EACCES too); a
    # socket's never does.
    if isinstance(exc, OSError) and exc.errno in _REASONS and exc.filename is None:
        return exc
    return None


def _only_bind_errors(exc: BaseException) -> OSError | None:
    """The first of the bind failures that are all of `exc`'s leaves, or None if `exc` holds
    anything else."""
    if isinstance(exc, BaseExceptionGroup):
        found: OSError | None = None
        for inner in exc.exceptions:
            leaf = _only_bind_errors(inner)
            if leaf is None:
                return None
            found = found or leaf
        return found
    return bind_error(exc)


@contextmanager
def naming_listener(flag: str, address: str) -> Iterator[None]:
    """Turn a bind failure raised inside into a `ListenerError` for `flag` (module doc)."""
    try:
        yield
    except BaseException as exc:  # groups too: the bind failed inside a nursery
        leaf = _only_bind_errors(exc)
        if leaf is None:
            raise
        raise ListenerError(flag, address, leaf) from exc
