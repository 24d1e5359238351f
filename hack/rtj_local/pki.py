"""Keys and certificates for the local control plane, made with the openssl CLI.

- ca.crt/ca.key: a throwaway CA; signs the API server's serving certificate. Clients (kubeconfigs, and
  pods through the kube-root-ca.crt ConfigMap) trust it.
- apiserver.crt/.key: serving certificate for 127.0.0.1, localhost and the in-cluster service names.
- sa.key/sa.pub: signs and verifies ServiceAccount tokens.
- apiserver-kubelet-client.crt/.key: the API server's client certificate towards kubelets (logs, exec),
  group system:masters; kubelets of real nodes trust ca.crt for client certificates.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SERVICE_IP = "10.96.0.1"  # first address of the service CIDR used by the cluster


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """Creates the files above, unless they exist (they are kept across restarts of a run dir)."""
    pki.mkdir(parents=True, exist_ok=True)
    if not ((pki / "apiserver.crt").exists() and (pki / "sa.pub").exists()):
        _make_ca_and_serving(pki)
    if not (pki / "apiserver-kubelet-client.crt").exists():
        _make_kubelet_client(pki)


def _make_kubelet_client(pki: Path) -> None:
    name = "apiserver-kubelet-client"
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=pki)
    (pki / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    )
    subj = "/O=system:masters/CN=kube-apiserver-kubelet-client"
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subj, "-out", f"{name}.csr", cwd=pki)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "3650", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.key").chmod(0o600)


def _make_ca_and_serving(pki: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=pki)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/CN=rtj-local-ca",
        "-out",
        "ca.crt",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=pki,
    )
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "apiserver.key", cwd=pki)
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectAltName=IP:127.0.0.1,IP:" + SERVICE_IP + ",DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
    )
    _openssl(
        "req",
        "-new",
        "-key",
        "apiserver.key",
        "-subj",
        "/CN=kube-apiserver",
        "-out",
        "apiserver.csr",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        "apiserver.ext",
        "-out",
        "apiserver.crt",
        cwd=pki,
    )
    # ServiceAccount token keys: ECDSA P-256 (ES256); quicker to make than RSA on a busy machine.
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for key in pki.glob("*.key"):
        key.chmod(0o600)
