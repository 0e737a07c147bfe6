"""A listener that cannot bind, said in one line that names the flag and the address.

A bind failure (`OSError` from `open_tcp_listeners`) is raised deep inside nested nurseries, so
it reaches the user as a nested `ExceptionGroup` traceback of 70 lines. Wrap the start of one
listener in `naming_listener(flag, address)`: a bind failure raised inside it, bare or as the
only kind of leaf of exception groups, becomes a `ListenerError` whose `str()` is the one line
the CLI prints (`error: <line>`) before it exits with status 1.

    with naming_listener("--client-listen", opts.client_listen):
        await nursery.start(service.run)

Invariants: only the bind errors named in `_REASONS` (port taken, address not on this machine,
a privileged port) are translated, and only when every leaf of the group is one of them; any
other exception, or a group that also holds something else, passes through unchanged, so a real
bug keeps its traceback. The original error stays reachable as `__cause__`.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ListenerError", "bind_error", "naming_listener"]

# errno -> what it means for a listener, and what to do (with {port} and {flag} filled in).
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


class ListenerError(Exception):
    """A listener could not bind `address`, the value of command-line flag `flag`."""

    def __init__(self, flag: str, address: str, code: int) -> None:
        self.flag = flag
        self.address = address
        self.errno = code
        host, _, port = address.rpartition(":")
        reason = _REASONS[code].format(port=port or address, host=host or address, flag=flag)
        super().__init__(f"{flag} {address}: {reason}")


def bind_error(exc: BaseException) -> int | None:
    """The errno of `exc` if it is a bind failure `naming_listener` translates, else None."""
    if isinstance(exc, OSError) and exc.errno in _REASONS:
        return exc.errno
    return None


def _only_bind_errors(exc: BaseException) -> int | None:
    """The errno shared by the bind failures that are all of `exc`'s leaves (the first one if
    they differ), or None if `exc` holds anything else."""
    if isinstance(exc, BaseExceptionGroup):
        found: int | None = None
        for inner in exc.exceptions:
            code = _only_bind_errors(inner)
            if code is None:
                return None
            found = found if found is not None else code
        return found
    return bind_error(exc)


@contextmanager
def naming_listener(flag: str, address: str) -> Iterator[None]:
    """Turn a bind failure raised inside into a `ListenerError` for `flag` (module doc)."""
    try:
        yield
    except BaseException as exc:  # groups too: the bind failed inside a nursery
        code = _only_bind_errors(exc)
        if code is None:
            raise
        raise ListenerError(flag, address, code) from exc
