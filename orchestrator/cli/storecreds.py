"""Where `orchestrator kv|member|status|backup` connect and with which credentials.

The store's client port requires mutual TLS (`security.peercerts`): a client certificate of the
cluster CA that is an admin's (or a server's). Sources, first match wins:

1. `--cacert FILE --cert FILE --key FILE` (all three);
2. `--data-dir DIR`: a server's data directory on this host, `DIR/pki/ca.crt` and the admin
   certificate `DIR/pki/admin.crt|key` the server writes at start;
3. `./data`, if it is such a directory (the default `--data-dir` of a server started here).

Without `--endpoints`, the endpoint is the client address that server wrote at start
(`DIR/client-address`), so `--data-dir` talks to THAT server, not to whatever listens on the
default port; with neither, 127.0.0.1:7101. The command says on stderr which cluster it talks
to: `cluster: CA sha256:<first 12 hex digits>` (the same digits as in the K10 join token).
Errors are one line (`CredentialsError`).
"""

from __future__ import annotations

import argparse
import hashlib
import ssl
from pathlib import Path

DEFAULT_CLIENT = "127.0.0.1:7101"
DEFAULT_DATA_DIR = Path("data")
CLIENT_ADDRESS_FILE = "client-address"  # as `server.CLIENT_ADDRESS_FILE`


class CredentialsError(ValueError):
    """No usable credentials or endpoint; the message says what to give."""


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoints",
        default=None,
        help="comma-separated client addresses of the servers (default: the client address "
        f"of the server whose --data-dir is given, else {DEFAULT_CLIENT})",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="a server's data directory on this host: its admin certificate (pki/admin.crt) "
        "and its client address (default ./data if it exists)",
    )
    parser.add_argument("--cacert", type=Path, help="the cluster CA certificate (PEM)")
    parser.add_argument("--cert", type=Path, help="an admin client certificate (PEM)")
    # dest client_key: `kv get|put|del KEY` has a positional "key"
    parser.add_argument(
        "--key", dest="client_key", type=Path, help="the client certificate's key (PEM)"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before giving up")


def _data_dir(args: argparse.Namespace) -> Path | None:
    given = getattr(args, "data_dir", None)
    if given is not None:
        if not (Path(given) / "pki" / "admin.crt").is_file():
            raise CredentialsError(
                f"{given} holds no admin certificate (pki/admin.crt): is it the --data-dir of a "
                "server that has started once?"
            )
        return Path(given)
    if (DEFAULT_DATA_DIR / "pki" / "admin.crt").is_file():
        return DEFAULT_DATA_DIR
    return None


def resolve(args: argparse.Namespace) -> tuple[list[str], ssl.SSLContext, str]:
    """(endpoints, TLS context, "CA sha256:<12 hex>") for a store command (module doc)."""
    from orchestrator.store.client import ClientTLS

    explicit = [getattr(args, n, None) for n in ("cacert", "cert", "client_key")]
    data_dir = None
    if any(explicit):
        if not all(explicit):
            raise CredentialsError("give --cacert, --cert and --key together")
        cacert, cert, key = (Path(str(p)) for p in explicit)
        tls = ClientTLS(cacert, cert, key)
    else:
        data_dir = _data_dir(args)
        if data_dir is None:
            raise CredentialsError(
                "no client credentials: give --data-dir DIR (a server's data directory on this "
                "host) or --cacert/--cert/--key (an admin certificate of the cluster CA)"
            )
        tls = ClientTLS.from_data_dir(data_dir)
    endpoints_text = getattr(args, "endpoints", None)
    if not endpoints_text and data_dir is not None:
        try:
            endpoints_text = (data_dir / CLIENT_ADDRESS_FILE).read_text().strip()
        except OSError:
            endpoints_text = None
    endpoints = [e.strip() for e in (endpoints_text or DEFAULT_CLIENT).split(",") if e.strip()]
    try:
        ca_pem = tls.ca.read_bytes()
        context = tls.context()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise CredentialsError(f"cannot load the client credentials: {exc}") from None
    return endpoints, context, f"CA sha256:{_fingerprint(ca_pem)[:12]}"


def _fingerprint(ca_pem: bytes) -> str:
    der = ssl.PEM_cert_to_DER_cert(ca_pem.decode("ascii", "replace"))
    return hashlib.sha256(der).hexdigest()
