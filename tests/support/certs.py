"""Certificates made by the tests (the ``cryptography`` package): a CA, a server certificate
for 127.0.0.1 and localhost, client certificates signed by the CA, and a client certificate
of a CA nobody trusts. Keys are EC P-256: quick to make and to handshake with."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pem:
    cert: Path
    key: Path
    both: Path  # certificate then key: what ssl.keystore.location takes


def _name(common_name: str, unit: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COUNTRY_NAME, "FR"),
             x509.NameAttribute(NameOID.ORGANIZATION_NAME, "oncelog")]
    if unit:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    parts.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(parts)


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "oncelog test CA") -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.dir / f"{name.replace(' ', '-')}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, file_stem: str, common_name: str, unit: str | None = None,
              server: bool = False, password: bytes | None = None) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, unit))
                   .issuer_name(self.name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=30)))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False)
        cert = builder.sign(self.key, hashes.SHA256())
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8, encryption)
        paths = Pem(self.dir / f"{file_stem}.crt", self.dir / f"{file_stem}.key",
                    self.dir / f"{file_stem}.pem")
        paths.cert.write_bytes(cert_pem)
        paths.key.write_bytes(key_pem)
        paths.both.write_bytes(cert_pem + key_pem)
        return paths
