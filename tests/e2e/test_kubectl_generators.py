"""End to end: kubectl's generator commands against a real `orchestrator server` process.

`kubectl create namespace|configmap|secret|serviceaccount|deployment|service` post their objects
through typed clients that send only protobuf (`application/vnd.kubernetes.protobuf`); `run` and
`expose` send JSON. Each command must print what kubectl prints against a real cluster, and the
object it made must read back (`kubectl get -o json`) with the fields the flags asked for plus
the server's defaults.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubectlrun import Kubectl, kubectl_binary, wait_api_ready

pytestmark = pytest.mark.slow

NS = "gen"


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def write_tls_pair(workdir: Path) -> tuple[bytes, bytes]:
    """A self-signed EC certificate and its key, written as tls.crt / tls.key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gen.example")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (workdir / "tls.crt").write_bytes(cert_pem)
    (workdir / "tls.key").write_bytes(key_pem)
    return cert_pem, key_pem


def container(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    (only,) = spec["containers"]
    return dict(only)


async def test_every_generator_creates_the_object_it_names(tmp_path: Path) -> None:
    binary = kubectl_binary()
    with Cluster(tmp_path / "cluster", size=1, extra_args=["--no-agent"]) as cluster:
        cluster.start()
        kubeconfig = await cluster.wait_api(0)
        assert kubeconfig == cluster.servers[0].kubeconfig
        wait_api_ready(cluster, 0)
        work = tmp_path / "work"
        work.mkdir()
        kube = Kubectl(binary, kubeconfig, tmp_path / "kube-cache", work)
        k = kube.with_namespace(NS)
        cert_pem, key_pem = write_tls_pair(work)
        (work / "blob.bin").write_bytes(b"\x00\xff\xfebin")

        # ------------------------------------------------------------ namespace (protobuf)
        assert kube.ok("create", "namespace", NS) == f"namespace/{NS} created\n"
        ns = kube.json("get", "namespace", NS)
        assert ns["metadata"]["name"] == NS
        assert ns["status"] == {"phase": "Active"}

        # ------------------------------------------------------------ configmaps (protobuf)
        out = k.ok("create", "configmap", "cm", "--from-literal=a=b", "--from-literal=c=d")
        assert out == "configmap/cm created\n"
        assert k.json("get", "configmap", "cm")["data"] == {"a": "b", "c": "d"}
        out = k.ok("create", "configmap", "bin", "--from-file=blob=blob.bin", "--from-literal=x=y")
        assert out == "configmap/bin created\n"
        cm = k.json("get", "configmap", "bin")
        assert cm["data"] == {"x": "y"}
        assert cm["binaryData"] == {"blob": b64(b"\x00\xff\xfebin")}

        # ------------------------------------------------------------ secrets (protobuf)
        out = k.ok("create", "secret", "generic", "s", "--from-literal=user=admin")
        assert out == "secret/s created\n"
        secret = k.json("get", "secret", "s")
        assert (secret["type"], secret["data"]) == ("Opaque", {"user": b64("admin")})

        out = k.ok("create", "secret", "tls", "t", "--cert=tls.crt", "--key=tls.key")
        assert out == "secret/t created\n"
        tls = k.json("get", "secret", "t")
        assert tls["type"] == "kubernetes.io/tls"
        assert tls["data"] == {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem)}

        out = k.ok(
            "create",
            "secret",
            "docker-registry",
            "pull",
            "--docker-server=registry.example",
            "--docker-username=u",
            "--docker-password=p",
        )
        assert out == "secret/pull created\n"
        pull = k.json("get", "secret", "pull")
        assert pull["type"] == "kubernetes.io/dockerconfigjson"
        assert list(pull["data"]) == [".dockerconfigjson"]
        assert b"registry.example" in base64.b64decode(pull["data"][".dockerconfigjson"])

        # ------------------------------------------------------------ serviceaccount (protobuf)
        assert k.ok("create", "serviceaccount", "robot") == "serviceaccount/robot created\n"
        assert k.json("get", "serviceaccount", "robot")["metadata"]["name"] == "robot"

        # ------------------------------------------------------------ deployments (protobuf)
        out = k.ok("create", "deployment", "web", "--image=nginx", "--replicas=2", "--port=80")
        assert out == "deployment.apps/web created\n"
        web = k.json("get", "deployment", "web")
        assert web["metadata"]["labels"] == {"app": "web"}
        assert web["spec"]["replicas"] == 2
        assert web["spec"]["selector"] == {"matchLabels": {"app": "web"}}
        assert web["spec"]["template"]["metadata"]["labels"] == {"app": "web"}
        assert web["spec"]["strategy"]["type"] == "RollingUpdate"  # defaulted
        c = container(web)
        assert (c["name"], c["image"]) == ("nginx", "nginx")
        assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]

        out = k.ok(
            "create", "deployment", "idle", "--image=busybox", "--replicas=0", "--", "sleep", "1h"
        )
        assert out == "deployment.apps/idle created\n"
        idle = k.json("get", "deployment", "idle")
        assert idle["spec"]["replicas"] == 0  # a zero that must not become the default 1
        assert container(idle)["command"] == ["sleep", "1h"]

        # ------------------------------------------------------------ run (JSON)
        out = k.ok("run", "solo", "--image=nginx", "--port=80", "--labels=a=b", "--env=K=V")
        assert out == "pod/solo created\n"
        pod = k.json("get", "pod", "solo")
        assert pod["metadata"]["labels"] == {"a": "b"}
        c = container(pod)
        assert c["env"] == [{"name": "K", "value": "V"}]
        assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]

        # ------------------------------------------------------------ expose (JSON)
        out = k.ok("expose", "deployment", "web", "--port=80", "--target-port=8080")
        assert out == "service/web exposed\n"
        svc = k.json("get", "service", "web")
        assert svc["spec"]["selector"] == {"app": "web"}
        assert svc["spec"]["type"] == "ClusterIP"
        assert [(p["port"], p["targetPort"], p["protocol"]) for p in svc["spec"]["ports"]] == [
            (80, 8080, "TCP")
        ]

        # ------------------------------------------------------------ services (protobuf)
        for kind, name, expected_type in (
            ("clusterip", "svc", "ClusterIP"),
            ("nodeport", "np", "NodePort"),
            ("loadbalancer", "lb", "LoadBalancer"),
        ):
            out = k.ok("create", "service", kind, name, "--tcp=80:8080")
            assert out == f"service/{name} created\n"
            svc = k.json("get", "service", name)
            assert svc["spec"]["type"] == expected_type
            assert svc["spec"]["selector"] == {"app": name}
            (port,) = svc["spec"]["ports"]
            assert (port["name"], port["port"], port["targetPort"]) == ("80-8080", 80, 8080)
            # allocated by the server (issue 19): an address of --service-cidr, node ports
            cidr = ipaddress.ip_network("10.43.0.0/16")
            assert ipaddress.ip_address(svc["spec"]["clusterIP"]) in cidr
            assert svc["spec"]["clusterIPs"] == [svc["spec"]["clusterIP"]]
            if expected_type != "ClusterIP":
                assert 30000 <= port["nodePort"] <= 32767
        out = k.ok("create", "service", "clusterip", "fixed", "--tcp=80", "--clusterip=10.43.200.1")
        assert out == "service/fixed created\n"
        assert k.json("get", "service", "fixed")["spec"]["clusterIP"] == "10.43.200.1"
        err = k.fails(
            "create", "service", "clusterip", "dup", "--tcp=80", "--clusterip=10.43.200.1"
        )
        assert "provided IP is already allocated" in err, err
        k.ok("create", "service", "clusterip", "headless", "--clusterip=None")
        assert k.json("get", "service", "headless")["spec"]["clusterIP"] == "None"
        out = k.ok("create", "service", "externalname", "ext", "--external-name=example.com")
        assert out == "service/ext created\n"
        ext = k.json("get", "service", "ext")
        assert (ext["spec"]["type"], ext["spec"]["externalName"]) == ("ExternalName", "example.com")

        # ------------------------------------------------------------ a second create conflicts
        err = k.fails("create", "configmap", "cm", "--from-literal=a=b")
        assert "AlreadyExists" in err or "already exists" in err, err

        cluster.check_alive()
