"""Certificates for the embedded cluster.

One CA signs everything: the apiserver's serving certificate (for 127.0.0.1
and localhost only), the admin client certificate used by gpulab, kubectl and
the notebooks (``system:masters``), one client certificate per control-plane
component (so the apiserver's audit and RBAC see real identities), and on
demand client certificates for namespace-scoped identities (grading).
The service-account token signing key is a separate key. All keys are ECDSA
P-256: Kubernetes accepts them everywhere, and they are generated in a
millisecond where RSA keys take a tenth of a second each.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .names import API_ADDRESS, CLUSTER_DOMAIN, KUBERNETES_SERVICE_IP

VALIDITY = dt.timedelta(days=3650)

# Client identities of the control plane: (file stem, CN, groups).
COMPONENTS = (
    ("admin", "gpulab-admin", ("system:masters",)),
    ("kube-controller-manager", "system:kube-controller-manager", ()),
    ("kube-scheduler", "system:kube-scheduler", ()),
    # kwok and the simulated kubelet patch node and pod status for every node;
    # they act for the whole node fleet, so they get cluster-admin by group.
    ("kwok", "gpulab:kwok", ("system:masters",)),
    ("node-agent", "gpulab:node-agent", ("system:masters",)),
    ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ()),
    ("front-proxy-client", "front-proxy-client", ()),
    # metrics-server: its API client identity and the client certificate it shows the "kubelets".
    ("metrics-server", "system:metrics-server", ()),
    # kube-proxy: the user the default ClusterRoleBinding system:node-proxier names.
    ("kube-proxy", "system:kube-proxy", ()),
)
# Where clients reach the apiserver: the host's loopback, the `kubernetes` Service (pods' in-cluster
# config), and its address inside the pod network (the Service's endpoint).
APISERVER_IPS = ("127.0.0.1", KUBERNETES_SERVICE_IP, API_ADDRESS)
APISERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   f"kubernetes.default.svc.{CLUSTER_DOMAIN}")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load(pki: Path, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((pki / f"{stem}.crt").read_bytes())
    key = serialization.load_pem_private_key((pki / f"{stem}.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    is_ca: bool = False,
    server: bool = False,
    dns_names: tuple[str, ...] = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
    ips: tuple[str, ...] = ("127.0.0.1",),
) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    issuer_cert, issuer_key = ca if ca else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
                ),
                critical=False,
            )
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(cn: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _names_all(cert_path: Path, ips: tuple[str, ...]) -> bool:
    """Whether the certificate at ``cert_path`` lists every one of ``ips`` among its subject alternative names."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return set(ips) <= have


def ensure(pki: Path) -> None:
    """Create whatever is missing under ``pki`` (idempotent; keeps existing files)."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        key = _key()
        _write_cert(_sign(_name("gpulab-ca"), key, None, is_ca=True), pki / "ca.crt")
        _write_key(key, pki / "ca.key")
    ca = _load(pki, "ca")
    if not (pki / "apiserver.crt").exists() or not _names_all(pki / "apiserver.crt", APISERVER_IPS):
        # (Re)issued when an address is missing: a cluster made before the pod network had only 127.0.0.1.
        key = _key()
        _write_cert(_sign(_name("kube-apiserver"), key, ca, server=True, dns_names=APISERVER_NAMES,
                          ips=APISERVER_IPS), pki / "apiserver.crt")
        _write_key(key, pki / "apiserver.key")
    for stem, cn, groups in COMPONENTS:
        if not (pki / f"{stem}.crt").exists():
            key = _key()
            # kwok serves the kubelet API for the simulated nodes, so its
            # certificate is a serving one too.
            _write_cert(_sign(_name(cn, groups), key, ca, server=stem == "kwok"), pki / f"{stem}.crt")
            _write_key(key, pki / f"{stem}.key")
    if not (pki / "sa.key").exists():
        key = _key()
        _write_key(key, pki / "sa.key")
        (pki / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def issue_client(pki: Path, stem: str, user: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A client certificate for ``user`` (e.g. a grading identity); returns (crt, key)."""
    ca = _load(pki, "ca")
    key = _key()
    crt_path, key_path = pki / f"{stem}.crt", pki / f"{stem}.key"
    _write_cert(_sign(_name(user, groups), key, ca), crt_path)
    _write_key(key, key_path)
    return crt_path, key_path


def issue_server(pki: Path, stem: str, cn: str, dns_names: tuple[str, ...],
                 ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A serving certificate (e.g. for an extension apiserver behind a Service, or the kubelet endpoint of
    the nodes at their addresses); idempotent: reissued only when an address in ``ips`` is missing."""
    crt_path, key_path = pki / f"{stem}.crt", pki / f"{stem}.key"
    want_ips = ("127.0.0.1", *ips)
    if crt_path.exists() and key_path.exists() and _names_all(crt_path, want_ips):
        return crt_path, key_path
    ca = _load(pki, "ca")
    key = _key()
    _write_cert(_sign(_name(cn), key, ca, server=True, dns_names=("localhost", *dns_names), ips=want_ips),
                crt_path)
    _write_key(key, key_path)
    return crt_path, key_path
