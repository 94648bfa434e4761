"""Certificates for the test control plane, made with the ``openssl`` command line tool.

One CA signs everything: the API server's serving certificate, the client certificate the API server
shows the node agent's log endpoint, and that endpoint's serving certificate. The service-account token
signing key is a separate key pair. EC P-256 keys: generated in milliseconds, accepted everywhere.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def make_ca(directory: Path, name: str = "ca", common_name: str = "ddpjob-test-ca") -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pair.key),
        "-out",
        str(pair.cert),
        "-days",
        "3650",
        "-subj",
        f"/CN={common_name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A certificate signed by ``ca``; ``server`` and/or ``client`` set its extended key usage."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    subject = "".join(f"/O={org}" for org in organizations) + f"/CN={common_name}"
    usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if usages:
        ext.append("extendedKeyUsage=" + ",".join(usages))
    sans = [f"DNS:{d}" for d in dns_names] + [f"IP:{ip}" for ip in ip_addresses]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    with tempfile.TemporaryDirectory() as tmp:
        csr, extfile = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
        extfile.write_text("\n".join(ext) + "\n")
        _openssl("req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject)
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca.cert),
            "-CAkey",
            str(ca.key),
            "-CAcreateserial",
            "-out",
            str(pair.cert),
            "-days",
            "3650",
            "-extfile",
            str(extfile),
        )
    return pair


def make_service_account_keys(directory: Path) -> KeyPair:
    """The key pair that signs and verifies service-account tokens (``cert`` is the public key)."""
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    _new_key(pair.key)
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
    return pair
