"""`orchestrator certs check|rotate`: the certificates in a server's or an agent's data dir.

    orchestrator certs check --data-dir DIR
    orchestrator certs rotate --data-dir DIR [--kubeconfig NODE_KUBECONFIG]

`check` lists every certificate it finds — file, subject, expiry, days left and a status: `ok`,
`renewal due` (inside the renewal window: the running process renews it at its next check, or
at its next start), `expired`, `not signed by the cluster CA`, `unreadable: ...`.

`rotate` re-issues the leaf certificates now, under the same CA, so kubeconfigs, join tokens and
client certificates stay valid:

* a server's data dir (`DIR/pki/`): the serving certificate `apiserver.crt` (a fresh key, the
  same SANs) and `apiserver-kubelet-client.crt` (servers with the API), the store's peer
  certificate `peer.crt` (same node id and SANs) and the admin client certificate `admin.crt`
  (every server), signed with the local CA key, and the embedded agent's log endpoint
  certificate `agent/kubelet.crt` (same node name and addresses);
* an agent's data dir (`DIR/kubelet.crt`): a fresh key and a certificate for the same names from
  the API server (`/orchestrator/v1/node-certificate`) with the node credentials in
  `DIR/node-kubeconfig.yaml` (or `--kubeconfig`), so the server must be reachable.

Stopped or running makes no difference: a stopped process uses the new pair at its next start;
a running one (its `security.renewal` loop compares the files with what it serves every 5 s)
swaps it into its listeners within seconds — new connections get the new certificate, open ones
keep theirs. No signal, no pid file. Pairs are written under their lock (`pki.pair_lock`), so a
rotation and the process's own renewal never leave a key beside the wrong certificate.

Errors (no such directory, no certificates, a PKI without its CA key, an unreachable server)
are one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

COMMANDS = frozenset({"certs"})
EMBEDDED_AGENT_CERT = "agent/kubelet.crt"  # a server's embedded agent: issued from the local CA
WATCH_NOTE = (
    "a running process serves the new certificates within seconds (it checks the files every "
    "5 s); a stopped one from its next start"
)


def add_parser(sub: Any) -> None:
    """Add `certs` to the `orchestrator` subparsers."""
    c = sub.add_parser("certs", help="list certificates and their expiry, or rotate them now")
    cs = c.add_subparsers(dest="certs_command", required=True)
    check = cs.add_parser(
        "check", help="each certificate in a data dir: subject, expiry, days left, status"
    )
    check.add_argument(
        "--data-dir", type=Path, required=True, help="a server's or an agent's --data-dir"
    )
    rotate = cs.add_parser(
        "rotate",
        help="re-issue the leaf certificates now (same CA: kubeconfigs and tokens stay valid)",
        description="Re-issue the serving and client certificates of a server's (or agent's) "
        "data dir under the same CA. " + WATCH_NOTE + ".",
    )
    rotate.add_argument(
        "--data-dir", type=Path, required=True, help="a server's or an agent's --data-dir"
    )
    rotate.add_argument(
        "--kubeconfig",
        type=Path,
        help="an agent's node credentials (default: DATA_DIR/node-kubeconfig.yaml)",
    )
    rotate.add_argument("--timeout", type=float, default=30.0, help="seconds (agent data dirs)")


class CertsError(Exception):
    """What went wrong, for people."""


@dataclass(frozen=True)
class Row:
    name: str  # path relative to the data dir
    subject: str
    not_after: dt.datetime | None
    status: str


def _data_dir(path: Path) -> Path:
    if not path.exists():
        raise CertsError(f"{path}: no such directory (give a server's or an agent's --data-dir)")
    if not path.is_dir():
        raise CertsError(f"{path} is not a directory")
    return path


def _leaves(data_dir: Path) -> list[tuple[str, dt.timedelta | None]]:
    """The certificates present (relative paths) and their renewal windows (None: the CA)."""
    from orchestrator.agent import servingcert
    from orchestrator.security.pki import RENEW_BEFORE

    out: list[tuple[str, dt.timedelta | None]] = []
    if (data_dir / "pki" / "ca.crt").exists():
        out.append(("pki/ca.crt", None))
    for name in ("apiserver.crt", "apiserver-kubelet-client.crt", "peer.crt", "admin.crt"):
        if (data_dir / "pki" / name).exists():
            out.append((f"pki/{name}", RENEW_BEFORE))
    if (data_dir / EMBEDDED_AGENT_CERT).exists():  # a server's own node agent
        out.append((EMBEDDED_AGENT_CERT, RENEW_BEFORE))
    if (data_dir / servingcert.CERT_FILE).exists():
        out.append((servingcert.CERT_FILE, servingcert.RENEW_BEFORE))
    if not out:
        raise CertsError(
            f"no certificates in {data_dir} (expected {data_dir}/pki/ of `orchestrator server` "
            f"or {data_dir}/{servingcert.CERT_FILE} of `orchestrator agent`)"
        )
    return out


def _cluster_ca(data_dir: Path, kubeconfig: Path | None = None) -> Any:
    """The cluster CA certificate: the server's `pki/ca.crt`, else the one in the agent's node
    kubeconfig; None when neither is readable."""
    from cryptography import x509

    from orchestrator.agent.join import CREDENTIALS_FILE

    try:
        return x509.load_pem_x509_certificate((data_dir / "pki" / "ca.crt").read_bytes())
    except (OSError, ValueError):
        pass
    from orchestrator.client.config import ConfigError, load_kubeconfig

    try:
        ca_pem = load_kubeconfig(kubeconfig or data_dir / CREDENTIALS_FILE).ca_pem
        return x509.load_pem_x509_certificate(ca_pem) if ca_pem else None
    except (ConfigError, OSError, ValueError):
        return None


def check_rows(data_dir: Path, *, now: dt.datetime | None = None) -> list[Row]:
    """One row per certificate in `data_dir` (blocking file I/O)."""
    from cryptography import x509

    from orchestrator.security.pki import signed_by

    now = now or dt.datetime.now(dt.UTC)
    data_dir = _data_dir(data_dir)
    ca = _cluster_ca(data_dir)
    rows: list[Row] = []
    for name, renew_before in _leaves(data_dir):
        path = data_dir / name
        try:  # replaced atomically: reading the certificate alone needs no lock
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as exc:
            rows.append(Row(name, "", None, f"unreadable: {exc}"))
            continue
        not_after = cert.not_valid_after_utc
        if not_after <= now:
            status = "expired"
        elif ca is not None and renew_before is not None and not signed_by(cert, ca):
            status = "not signed by the cluster CA"
        elif renew_before is not None and not_after - renew_before <= now:
            status = "renewal due"
        else:
            status = "ok"
        rows.append(Row(name, cert.subject.rfc4514_string(), not_after, status))
    return rows


def print_rows(rows: list[Row], now: dt.datetime) -> None:
    table = [("CERTIFICATE", "SUBJECT", "EXPIRES", "DAYS LEFT", "STATUS")]
    for r in rows:
        expires = r.not_after.strftime("%Y-%m-%dT%H:%M:%SZ") if r.not_after else "-"
        days = str((r.not_after - now).days) if r.not_after else "-"
        table.append((r.name, r.subject or "-", expires, days, r.status))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "   " + row[-1])


def rotate(data_dir: Path, kubeconfig: Path | None = None, timeout: float = 30.0) -> list[str]:
    """Re-issue every leaf in `data_dir` (module doc); the relative paths renewed."""
    from orchestrator.agent import servingcert

    data_dir = _data_dir(data_dir)
    names = [name for name, _ in _leaves(data_dir)]
    done: list[str] = []
    if "pki/apiserver.crt" in names:
        from orchestrator.apiserver.logproxy import kubelet_client_cert
        from orchestrator.security.pki import PkiError, load_pki, renew_serving_cert

        try:
            pki = load_pki(data_dir)
        except PkiError as exc:
            raise CertsError(str(exc)) from None
        renew_serving_cert(pki, None)  # the SANs of the current certificate
        kubelet_client_cert(pki, force=True)
        done += ["pki/apiserver.crt", "pki/apiserver-kubelet-client.crt"]
    if "pki/peer.crt" in names or "pki/admin.crt" in names:
        done += _rotate_store_certs(data_dir, names)
    if EMBEDDED_AGENT_CERT in names:
        _rotate_embedded_agent_cert(data_dir)
        done.append(EMBEDDED_AGENT_CERT)
    if servingcert.CERT_FILE in names:

        async def bounded() -> None:
            try:
                with trio.fail_after(timeout):
                    await _rotate_agent(data_dir, kubeconfig)
            except trio.TooSlowError:
                raise CertsError(
                    f"timed out after {timeout:g} s asking the API server for a new certificate"
                ) from None

        trio.run(bounded)
        done.append(servingcert.CERT_FILE)
    return done


def _rotate_embedded_agent_cert(data_dir: Path) -> None:
    """Re-issue the embedded agent's serving certificate from the local CA: same subject
    (`system:node:<name>`), same names and addresses, a fresh key."""
    from cryptography import x509

    from orchestrator.security.pki import (
        PkiError,
        issue_serving_cert,
        load_pki,
        pair_lock,
        write_pair,
    )

    cert_path = data_dir / EMBEDDED_AGENT_CERT
    try:
        pki = load_pki(data_dir)
    except PkiError as exc:
        raise CertsError(str(exc)) from None
    with pair_lock(cert_path):
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        alt = x509.SubjectAlternativeName([])
    sans = [*alt.get_values_for_type(x509.DNSName)]
    sans += [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)]
    crt, key = issue_serving_cert(pki, str(cn), sans)
    write_pair(cert_path, cert_path.with_name("kubelet.key"), crt, key)


def _rotate_store_certs(data_dir: Path, names: list[str]) -> list[str]:
    """Re-issue the peer certificate (same node id, same SANs) and the admin certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from orchestrator.security.peercerts import issue_admin_cert, issue_peer_cert, server_node_id
    from orchestrator.security.pki import PkiError

    if not (data_dir / "pki" / "ca.key").is_file():
        raise CertsError(
            f"{data_dir / 'pki'}: no ca.key, so no certificate can be issued; restore it from a "
            "backup or another server's DATA_DIR/pki/"
        )
    done: list[str] = []
    try:
        if "pki/peer.crt" in names:
            cert = x509.load_pem_x509_certificate((data_dir / "pki" / "peer.crt").read_bytes())
            node_id = server_node_id(cert.public_bytes(serialization.Encoding.DER))
            if not isinstance(node_id, int):
                raise CertsError(f"{data_dir / 'pki' / 'peer.crt'}: {node_id}")
            issue_peer_cert(data_dir, node_id, None)  # the SANs of the current certificate
            done.append("pki/peer.crt")
        if "pki/admin.crt" in names:
            issue_admin_cert(data_dir)
            done.append("pki/admin.crt")
    except (PkiError, OSError, ValueError) as exc:
        raise CertsError(str(exc)) from None
    return done


async def _rotate_agent(data_dir: Path, kubeconfig: Path | None) -> None:
    from cryptography import x509

    from orchestrator.agent import servingcert
    from orchestrator.agent.join import CREDENTIALS_FILE
    from orchestrator.client.config import ConfigError, load_kubeconfig
    from orchestrator.client.protocol import ApiConnectionError, ApiException

    path = kubeconfig or data_dir / CREDENTIALS_FILE
    try:
        cfg = load_kubeconfig(path)
    except (ConfigError, OSError) as exc:
        raise CertsError(
            f"{path}: no node credentials to ask the server with ({exc}); give the agent's "
            "--kubeconfig"
        ) from None
    cert_path, _ = servingcert.paths(data_dir)
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound) as exc:
        raise CertsError(f"{cert_path}: cannot tell which names to renew it for ({exc})") from None
    ips = [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    addresses = [*sans.get_values_for_type(x509.DNSName), *ips]
    try:
        await servingcert.renew(cfg, data_dir, addresses)
    except (ApiException, ApiConnectionError, ValueError) as exc:
        raise CertsError(f"{cfg.server} did not renew {cert_path}: {exc}") from None


def main(args: argparse.Namespace) -> int:
    now = dt.datetime.now(dt.UTC)
    try:
        if args.certs_command == "check":
            print_rows(check_rows(args.data_dir, now=now), now)
            return 0
        done = rotate(args.data_dir, args.kubeconfig, args.timeout)
        rows = {r.name: r for r in check_rows(args.data_dir, now=now)}
        for name in done:
            row = rows.get(name)
            until = row.not_after.strftime("%Y-%m-%dT%H:%M:%SZ") if row and row.not_after else "?"
            print(f"{args.data_dir / name}: renewed, valid until {until}")
        print(f"the CA is unchanged; {WATCH_NOTE}", file=sys.stderr)
        return 0
    except (CertsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
