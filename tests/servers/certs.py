"""A private CA and server certificates for the TLS tests, made with the ``cryptography``
package: a good leaf for 127.0.0.1 and localhost, an expired one, one for another host,
and a self-signed one (all PEM files in one folder)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    """The PEM files: ``ca`` (the CA's certificate, for --ca-file) and (cert, key) pairs."""

    ca: str
    good: Tuple[str, str]  # 127.0.0.1 and localhost, signed by the CA
    expired: Tuple[str, str]  # the same names, expired yesterday
    wrong_host: Tuple[str, str]  # valid for wrong.example only
    self_signed: Tuple[str, str]  # 127.0.0.1 and localhost, signed by itself


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(folder: Path, stem: str, cert, key) -> Tuple[str, str]:
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def _leaf(cn: str, names: List[str], issuer_cert, issuer_key, *, expired: bool = False, self_signed: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)) if expired else \
        (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))
    sans: List[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    issuer = _name(cn) if self_signed else issuer_cert.subject
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key if self_signed else issuer_key, hashes.SHA256()))
    return cert, key


def make_certs(folder: Path) -> Certs:
    """Makes the CA and the four leaves in ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(_name("loadgen test CA")).issuer_name(_name("loadgen test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=30)).not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    ca_path, _ = _write(folder, "ca", ca, ca_key)
    names = ["127.0.0.1", "localhost"]
    return Certs(
        ca=ca_path,
        good=_write(folder, "good", *_leaf("127.0.0.1", names, ca, ca_key)),
        expired=_write(folder, "expired", *_leaf("127.0.0.1", names, ca, ca_key, expired=True)),
        wrong_host=_write(folder, "wrong-host", *_leaf("wrong.example", ["wrong.example"], ca, ca_key)),
        self_signed=_write(folder, "self-signed", *_leaf("127.0.0.1", names, None, None, self_signed=True)),
    )
