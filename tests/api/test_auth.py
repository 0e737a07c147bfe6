"""PKI, tokens, authentication, authorization (role table, NodeRestriction) and kubeconfigs."""

from __future__ import annotations

import base64
import datetime as dt
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from orchestrator.kube.errors import ApiError
from orchestrator.security import (
    Attributes,
    Authenticator,
    TokenStore,
    User,
    admit_node,
    authorize,
    ensure_pki,
    issue_client_cert,
    load_kubeconfig,
    may_write_status,
    node_may_read,
    write_kubeconfig,
)
from orchestrator.security.authn import bearer_token, user_from_certificate
from orchestrator.security.authz import authorize_resource
from orchestrator.security.tokens import BOOTSTRAP_RE

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def sans_of(cert: x509.Certificate) -> set[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in ext.get_values_for_type(x509.DNSName)} | {
        str(v) for v in ext.get_values_for_type(x509.IPAddress)
    }


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# --- PKI ---------------------------------------------------------------------------------------


def test_pki_created_once_and_serving_cert_follows_sans(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, ["10.0.0.7", "edge.example"], now=NOW)
    d = tmp_path / "pki"
    assert mode(d / "ca.key") == 0o600
    assert mode(d / "apiserver.key") == 0o600
    assert {"localhost", "127.0.0.1", "::1", "10.0.0.7", "edge.example"} <= sans_of(
        pki.serving_cert
    )
    basic = pki.ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca
    assert pki.ca_cert.not_valid_after_utc - NOW > dt.timedelta(days=3640)
    assert pki.ca_hash().startswith("sha256:")

    again = ensure_pki(tmp_path, ["10.0.0.7", "edge.example"], now=NOW)
    assert again.ca_cert == pki.ca_cert
    assert again.serving_cert == pki.serving_cert  # same SANs: kept

    moved = ensure_pki(tmp_path, ["10.0.0.8"], now=NOW)
    assert moved.ca_cert == pki.ca_cert  # the CA never changes
    assert moved.serving_cert != pki.serving_cert
    assert "10.0.0.8" in sans_of(moved.serving_cert)
    assert "10.0.0.7" not in sans_of(moved.serving_cert)

    late = ensure_pki(tmp_path, ["10.0.0.8"], now=NOW + dt.timedelta(days=300))
    assert late.serving_cert != moved.serving_cert  # within 120 days of expiry: renewed
    assert late.ca_cert == pki.ca_cert


def test_pki_refuses_half_a_ca(tmp_path: Path) -> None:
    ensure_pki(tmp_path, [], now=NOW)
    (tmp_path / "pki" / "ca.key").unlink()
    with pytest.raises(RuntimeError, match=r"ca\.key"):
        ensure_pki(tmp_path, [], now=NOW)


def test_client_certificates(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [], now=NOW)
    cert_pem, key_pem = issue_client_cert(pki, "alice", ["devs", "system:viewers"], now=NOW)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert serialization.load_pem_private_key(key_pem, None) is not None
    der = cert.public_bytes(serialization.Encoding.DER)

    user = user_from_certificate(der, pki.ca_cert, NOW)
    assert user == User("alice", ("devs", "system:viewers", "system:authenticated"))
    assert user_from_certificate(der, pki.ca_cert, NOW + dt.timedelta(days=400)) is None
    assert user_from_certificate(der, pki.ca_cert, NOW - dt.timedelta(days=1)) is None
    assert user_from_certificate(b"garbage", pki.ca_cert, NOW) is None

    other = ensure_pki(tmp_path / "other", [], now=NOW)
    foreign, _ = issue_client_cert(other, "mallory", ["system:masters"], now=NOW)
    foreign_der = x509.load_pem_x509_certificate(foreign).public_bytes(serialization.Encoding.DER)
    assert user_from_certificate(foreign_der, pki.ca_cert, NOW) is None

    serving_der = pki.serving_cert.public_bytes(serialization.Encoding.DER)
    assert user_from_certificate(serving_der, pki.ca_cert, NOW) is None  # server auth only


# --- tokens ------------------------------------------------------------------------------------


def test_token_store(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    store = TokenStore.open(tmp_path, clock)
    admin = store.ensure_admin()
    assert admin is not None
    node = store.add_node("edge-1")
    ctrl = store.add_component("system:kube-controller-manager")
    path = tmp_path / "tokens.yaml"
    assert mode(path) == 0o600
    text = path.read_text()
    for token in (admin, node, ctrl):
        assert token not in text  # hashes only

    reopened = TokenStore.open(tmp_path, clock)
    assert reopened.ensure_admin() is None  # not regenerated
    admin_entry = reopened.lookup(admin)
    assert admin_entry is not None
    assert (admin_entry.name, admin_entry.groups) == ("system:admin", ("system:masters",))
    node_entry = reopened.lookup(node)
    assert node_entry is not None
    assert (node_entry.name, node_entry.groups) == ("system:node:edge-1", ("system:nodes",))
    ctrl_entry = reopened.lookup(ctrl)
    assert ctrl_entry is not None
    assert ctrl_entry.name == "system:kube-controller-manager"
    assert reopened.lookup("nope") is None
    assert reopened.lookup("") is None

    rotated = reopened.add_node("edge-1")
    assert reopened.lookup(node) is None
    assert reopened.lookup(rotated) is not None
    assert reopened.revoke("system:node:edge-1")
    assert reopened.lookup(rotated) is None
    with pytest.raises(ValueError, match="system:"):
        reopened.add_component("controller")


def test_bootstrap_tokens_expire(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    store = TokenStore.open(tmp_path, clock)
    token = store.create_bootstrap_token(ttl=60)
    m = BOOTSTRAP_RE.match(token)
    assert m is not None
    entry = store.lookup(token)
    assert entry is not None
    assert entry.name == f"system:bootstrap:{m.group(1)}"
    assert entry.groups == ("system:bootstrappers",)
    clock.t = 1059.0
    assert store.lookup(token) is not None
    clock.t = 1060.0
    assert store.lookup(token) is None
    assert store.prune_expired() == 1
    assert TokenStore.open(tmp_path, clock).entries == []


# --- authentication ---------------------------------------------------------------------------


def test_authenticator(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [], now=NOW)
    store = TokenStore.open(tmp_path)
    token = store.add("bob", ["devs"])
    authn = Authenticator(store, pki.ca_cert, clock=lambda: NOW.timestamp())
    bob = User("bob", ("devs", "system:authenticated"))
    assert authn.authenticate([(b"authorization", f"Bearer {token}".encode())], None) == bob
    assert authn.authenticate({"Authorization": f"bearer  {token} "}, None) == bob
    assert authn.authenticate({b"Authorization": f"Bearer {token}".encode()}, None) == bob
    assert authn.authenticate([(b"authorization", b"Bearer wrong")], None) is None
    assert authn.authenticate({"Authorization": "Basic Ym9iOnB3"}, None) is None
    assert authn.authenticate([], None) is None
    assert bearer_token({"authorization": "Bearer"}) is None

    cert_pem, _ = issue_client_cert(pki, "carol", ["system:masters"], now=NOW)
    der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    carol = User("carol", ("system:masters", "system:authenticated"))
    assert authn.authenticate([], der) == carol
    # A bearer header decides alone: a wrong token is not rescued by a certificate.
    assert authn.authenticate([(b"authorization", b"Bearer wrong")], der) is None


# --- authorization -----------------------------------------------------------------------------

ADMIN = User("system:admin", ("system:masters", "system:authenticated"))
CTRL = User("system:kube-controller-manager", ("system:authenticated",))
VIEWER = User("vera", ("system:viewers", "system:authenticated"))
NODE = User("system:node:n1", ("system:nodes", "system:authenticated"))
FAKE_NODE = User("system:node:n1", ("system:authenticated",))  # name without the group
BOOT = User("system:bootstrap:abcdef", ("system:bootstrappers", "system:authenticated"))
NOBODY = User("nobody", ("system:authenticated",))


def outcome(call: Any, *args: Any) -> int:
    """200 if `call(*args)` returns, else the ApiError's code."""
    try:
        call(*args)
    except ApiError as e:
        return e.code
    return 200


def allowed(user: User, *args: str) -> bool:
    code = outcome(authorize, user, Attributes(*args))
    assert code in (200, 403)
    return code == 200


@pytest.mark.parametrize(
    ("user", "attrs", "ok"),
    [
        (ADMIN, ("delete", "apps", "deployments", "", "default", "web"), True),
        (ADMIN, ("post", "", "", "", "", "", "/anything"), True),
        (CTRL, ("update", "apps", "deployments", "status", "default", "web"), True),
        (CTRL, ("create", "", "pods", "", "default"), True),
        (CTRL, ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", "", "x"), False),
        (CTRL, ("list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), True),
        (CTRL, ("update", "apiextensions.k8s.io", "customresourcedefinitions", "status"), True),
        (VIEWER, ("list", "apps", "deployments", "", "default"), True),
        (VIEWER, ("watch", "", "pods", "", ""), True),
        (VIEWER, ("get", "", "secrets", "", "default", "s"), False),
        (VIEWER, ("delete", "", "pods", "", "default", "p"), False),
        (NODE, ("get", "", "secrets", "", "default", "s"), True),
        (NODE, ("list", "", "pods", "", ""), True),
        (NODE, ("create", "", "nodes", "", "", ""), True),
        (NODE, ("patch", "", "nodes", "status", "", "n1"), True),
        (NODE, ("patch", "", "nodes", "status", "", "n2"), False),
        (NODE, ("update", "", "nodes", "", "", "n2"), False),
        (NODE, ("delete", "", "nodes", "", "", "n1"), False),
        (NODE, ("patch", "", "pods", "status", "default", "p"), True),
        (NODE, ("update", "", "pods", "", "default", "p"), False),
        (NODE, ("create", "", "pods", "", "default"), False),
        (NODE, ("get", "", "pods", "log", "default", "p"), False),
        (NODE, ("delete", "", "pods", "", "default", "p"), True),
        (NODE, ("update", "coordination.k8s.io", "leases", "", "kube-node-lease", "n1"), True),
        (NODE, ("create", "coordination.k8s.io", "leases", "", "kube-node-lease", ""), True),
        (NODE, ("update", "coordination.k8s.io", "leases", "", "kube-node-lease", "n2"), False),
        (NODE, ("update", "coordination.k8s.io", "leases", "", "default", "n1"), False),
        (NODE, ("create", "", "events", "", "default"), True),
        (NODE, ("create", "events.k8s.io", "events", "", "default"), True),
        (NODE, ("create", "", "configmaps", "", "default"), False),
        (FAKE_NODE, ("get", "", "secrets", "", "default", "s"), False),
        (BOOT, ("create", "certificates.k8s.io", "certificatesigningrequests", "", ""), True),
        (BOOT, ("get", "", "pods", "", "default", "p"), False),
        (NOBODY, ("get", "", "", "", "", "", "/apis/apps/v1"), True),
        (NOBODY, ("get", "", "", "", "", "", "/api"), True),
        (NOBODY, ("get", "", "", "", "", "", "/openapi/v3"), True),
        (NOBODY, ("get", "", "", "", "", "", "/metrics"), False),
        (NOBODY, ("get", "", "pods", "", "default", "p"), False),
    ],
)
def test_role_table(user: User, attrs: tuple[str, ...], ok: bool) -> None:
    assert allowed(user, *attrs) is ok


def test_remembered_decisions_tell_names_and_users_apart() -> None:
    """Decisions are remembered; the key keeps what a rule reads: a node's own name or
    another's, and the node itself."""
    n2 = User("system:node:n2", NODE.groups)
    lease = ("update", "coordination.k8s.io", "leases", "", "kube-node-lease")
    for _ in range(2):
        assert allowed(NODE, *lease, "n1")
        assert not allowed(NODE, *lease, "n2")
        assert not allowed(NODE, *lease, "n3")
        assert allowed(n2, *lease, "n2")
        assert not allowed(n2, *lease, "n1")
        assert not allowed(FAKE_NODE, *lease, "n1")
        assert CTRL.groups == NOBODY.groups  # the name alone makes a controller
        assert allowed(CTRL, "create", "", "pods", "", "default")
        assert not allowed(NOBODY, "create", "", "pods", "", "default")
        # The API server's path asks with the parts, not an Attributes, and agrees.
        assert outcome(authorize_resource, NODE, *lease, "n1") == 200
        assert outcome(authorize_resource, NODE, *lease, "n2") == 403
        assert outcome(authorize_resource, NOBODY, "create", "", "pods", "", "default", "") == 403


def test_forbidden_messages() -> None:
    with pytest.raises(ApiError) as info:
        authorize(VIEWER, Attributes("get", "", "secrets", "", "default", "s"))
    assert info.value.message == (
        'secrets "s" is forbidden: User "vera" cannot get resource "secrets" in API group "" '
        'in the namespace "default"'
    )
    with pytest.raises(ApiError) as info:
        authorize(NODE, Attributes("patch", "", "nodes", "status", "", "n2"))
    assert 'cannot patch resource "nodes/status" in API group "" at the cluster scope' in (
        info.value.message
    )
    with pytest.raises(ApiError) as info:
        authorize(NOBODY, Attributes("get", path="/metrics"))
    assert info.value.message == 'forbidden: User "nobody" cannot get path "/metrics"'


def test_may_write_status() -> None:
    assert may_write_status(ADMIN)
    assert may_write_status(CTRL)
    assert may_write_status(User("x", ("system:controllers",)))
    assert may_write_status(NODE)
    assert not may_write_status(VIEWER)
    assert not may_write_status(NOBODY)
    assert not may_write_status(FAKE_NODE)


def pod(name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def lease(name: str, ns: str = "kube-node-lease") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}}


def node_obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


@pytest.mark.parametrize(
    ("verb", "kind", "sub", "obj", "old", "ok"),
    [
        ("create", "Node", "", node_obj("n1"), None, True),
        ("create", "Node", "", node_obj("n2"), None, False),
        ("update", "Node", "status", node_obj("n1"), node_obj("n1"), True),
        ("update", "Node", "", node_obj("n1"), node_obj("n2"), False),
        ("update", "Pod", "status", pod("p", "n1"), pod("p", "n1"), True),
        ("update", "Pod", "status", pod("p", "n2"), pod("p", "n2"), False),
        ("update", "Pod", "status", pod("p", "n1"), pod("p", None), False),
        ("update", "Pod", "", pod("p", "n1"), pod("p", "n1"), False),
        ("create", "Pod", "", pod("p", "n1"), None, False),
        ("delete", "Pod", "", pod("p", "n1"), pod("p", "n1"), True),
        ("delete", "Pod", "", pod("p", "n2"), pod("p", "n2"), False),
        ("create", "Lease", "", lease("n1"), None, True),
        ("update", "Lease", "", lease("n1"), lease("n1"), True),
        ("create", "Lease", "", lease("n2"), None, False),
        ("create", "Lease", "", lease("n1", "default"), None, False),
        ("create", "Event", "", {"metadata": {"name": "e"}}, None, True),
        ("create", "ConfigMap", "", {"metadata": {"name": "c"}}, None, False),
    ],
)
def test_node_restriction(
    verb: str,
    kind: str,
    sub: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    ok: bool,
) -> None:
    assert outcome(admit_node, NODE, verb, kind, sub, obj, old) == (200 if ok else 403)
    admit_node(ADMIN, verb, kind, sub, obj, old)  # not a node: untouched


def test_node_may_read() -> None:
    p = pod("p", "n1")
    p["spec"]["volumes"] = [{"name": "v", "secret": {"secretName": "tls"}}]
    p["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}}]
    secret = {"metadata": {"name": "tls", "namespace": "default"}}
    other = {"metadata": {"name": "db", "namespace": "default"}}
    cfg = {"metadata": {"name": "cfg", "namespace": "default"}}
    assert node_may_read(NODE, "Secret", secret, [p])
    assert not node_may_read(NODE, "Secret", other, [p])
    assert node_may_read(NODE, "ConfigMap", cfg, [p])
    assert not node_may_read(NODE, "Secret", secret, [pod("q", "n2")])
    assert node_may_read(VIEWER, "Secret", other, [])


# --- kubeconfig ----------------------------------------------------------------------------------


def test_kubeconfig_round_trip(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [], now=NOW)
    path = tmp_path / "kubeconfig.yaml"
    write_kubeconfig(path, "https://127.0.0.1:6443", pki.ca_pem, "system:admin", token="t0k")
    assert mode(path) == 0o600
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "orchestrator"
    assert doc["kind"] == "Config"
    cluster = doc["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"]) == pki.ca_pem
    assert doc["users"][0] == {"name": "system:admin", "user": {"token": "t0k"}}
    assert doc["contexts"][0]["context"] == {"cluster": "orchestrator", "user": "system:admin"}
    cfg = load_kubeconfig(path)
    assert (cfg.server, cfg.ca_pem, cfg.token) == ("https://127.0.0.1:6443", pki.ca_pem, "t0k")

    cert, key = issue_client_cert(pki, "alice", ["devs"], now=NOW)
    write_kubeconfig(
        path, "https://h:1", pki.ca_pem, "alice", client_cert=cert, client_key=key,
        context_name="edge",
    )  # fmt: skip
    cfg = load_kubeconfig(path, context="edge")
    assert (cfg.cert_pem, cfg.key_pem, cfg.token, cfg.insecure) == (cert, key, None, False)


def test_kubeconfig_with_ca_file(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, [], now=NOW)
    path = tmp_path / "kc.yaml"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": "https://x", "certificate-authority": "pki/ca.crt"}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(doc))
    assert load_kubeconfig(path).ca_pem == pki.ca_pem
