"""SCRAM (RFC 5802, RFC 7677) as Kafka speaks it: the math and the four messages, for both
ends. The broker's exchange (security/sasl_server.py) and the client's
(client/network/sasl.py) use only this module, so the two cannot disagree. Pure: no I/O.

A credential is what a server keeps of a password: salt, iterations, StoredKey = H(ClientKey)
and ServerKey, never the password nor anything a client could log in with. Kafka's names and
bounds: SCRAM-SHA-256 and SCRAM-SHA-512, 4096..16384 iterations, and the text form Kafka keeps
under ``/config/users/<user>`` (``salt=...,stored_key=...,server_key=...,iterations=...``).

Kafka takes the password as its UTF-8 bytes (no SASLprep), and so does this module.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism bounds; AlterUserScramCredentials refuses outside them.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
# Kafka's mechanism numbers in Describe/AlterUserScramCredentials.
MECHANISM_TYPES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {number: name for name, number in MECHANISM_TYPES.items()}
_NONCE_BYTES = 24
# A client-first message longer than this is refused before it is parsed (a user name and a
# nonce; Kafka's sasl.server.max.receive.size bounds the whole exchange).
MAX_MESSAGE = 4096


class ScramError(ValueError):
    """A message that is not what the exchange expects; the text is safe to log."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_text(self) -> str:
        """Kafka's form: salt=...,stored_key=...,server_key=...,iterations=..."""
        return (f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
                f"server_key={_b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        try:
            fields = dict(item.split("=", 1) for item in text.split(","))
            return cls(_unb64(fields["salt"]), _unb64(fields["stored_key"]),
                       _unb64(fields["server_key"]), int(fields["iterations"]))
        except (KeyError, ValueError) as exc:
            raise ScramError(f"not a SCRAM credential: {exc}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ScramError("bad base64") from None


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unknown SCRAM mechanism {mechanism!r}") from None


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_digest(mechanism), password, salt, iterations)


def _hmac(mechanism: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, MECHANISMS[mechanism]).digest()


def _hash(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(MECHANISMS[mechanism], data).digest()


def client_key(mechanism: str, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Client Key")


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes,
                           iterations: int) -> ScramCredential:
    return ScramCredential(salt, _hash(mechanism, client_key(mechanism, salted)),
                           _hmac(mechanism, salted, b"Server Key"), iterations)


def make_credential(mechanism: str, password: bytes, salt: bytes | None = None,
                    iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """A credential for ``password``; a random salt unless one is given."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"iterations must be within {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                         f"got {iterations}")
    salt = secrets.token_bytes(32) if salt is None else salt
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt,
                                                             iterations), salt, iterations)


def password_matches(mechanism: str, credential: ScramCredential, password: bytes) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (SASL/PLAIN's check)."""
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    return secrets.compare_digest(_hash(mechanism, client_key(mechanism, salted)),
                                  credential.stored_key)


def new_nonce() -> str:
    return secrets.token_urlsafe(_NONCE_BYTES)  # printable, never a comma


def escape_username(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(text: str) -> str:
    if "=" in text.replace("=3D", "").replace("=2C", ""):
        raise ScramError("a user name with an unescaped '='")
    return text.replace("=2C", ",").replace("=3D", "=")


def _attributes(text: str) -> list[tuple[str, str]]:
    """``a=x,b=y`` -> [(a, x), (b, y)]; every attribute one letter, as RFC 5802 has them,
    except Kafka's extensions (``tokenauth=true``)."""
    out = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScramError(f"malformed attribute {item[:40]!r}")
        out.append((key, value))
    return out


def _decode(message: bytes) -> str:
    if len(message) > MAX_MESSAGE:
        raise ScramError(f"a message of {len(message)} bytes")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("a message that is not UTF-8") from None


# --- the four messages ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str  # "n,," or "n,a=<authzid>," (or "y,,": no channel binding either way)
    username: str
    nonce: str
    bare: str  # the message without its gs2 header: part of the AuthMessage
    extensions: dict[str, str]


def client_first(username: str, nonce: str) -> bytes:
    return f"n,,n={escape_username(username)},r={nonce}".encode()


def parse_client_first(message: bytes) -> ClientFirst:
    text = _decode(message)
    flag, sep1, rest = text.partition(",")
    authzid, sep2, bare = rest.partition(",")
    if not (sep1 and sep2) or flag not in ("n", "y"):
        # "p=..." asks for channel binding, which Kafka does not offer either.
        raise ScramError("the GS2 header must be n or y (no channel binding)")
    if authzid and not authzid.startswith("a="):
        raise ScramError("malformed authorization id")
    attrs = _attributes(bare)
    if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
        raise ScramError("expected n=<user>,r=<nonce>")
    username = unescape_username(attrs[0][1])
    nonce = attrs[1][1]
    if not username or not nonce or not nonce.isprintable():
        raise ScramError("an empty user name or nonce")
    if authzid and unescape_username(authzid[2:]) != username:
        raise ScramError("the authorization id is not the user name")
    extensions = dict(attrs[2:])
    return ClientFirst(f"{flag},{authzid},", username, nonce, bare, extensions)


def server_first(nonce: str, credential: ScramCredential) -> bytes:
    return f"r={nonce},s={_b64(credential.salt)},i={credential.iterations}".encode()


@dataclass(frozen=True, slots=True)
class ServerFirst:
    nonce: str
    salt: bytes
    iterations: int
    text: str


def parse_server_first(message: bytes, client_nonce: str) -> ServerFirst:
    text = _decode(message)
    attrs = dict(_attributes(text))
    if "e" in attrs:
        raise ScramError(f"the server refused: {attrs['e']}")
    try:
        nonce, salt, iterations = attrs["r"], _unb64(attrs["s"]), int(attrs["i"])
    except (KeyError, ValueError):
        raise ScramError("expected r=<nonce>,s=<salt>,i=<iterations>") from None
    if not nonce.startswith(client_nonce) or len(nonce) == len(client_nonce):
        raise ScramError("the server's nonce does not extend ours")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"{iterations} iterations")
    return ServerFirst(nonce, salt, iterations, text)


def _auth_message(first_bare: str, server_first_text: str, final_without_proof: str) -> bytes:
    return f"{first_bare},{server_first_text},{final_without_proof}".encode()


def client_final(mechanism: str, password: bytes, first: ClientFirst | str,
                 server: ServerFirst) -> tuple[bytes, bytes]:
    """(client-final message, the ServerSignature the server must answer with)."""
    gs2, bare = ("n,,", first) if isinstance(first, str) else (first.gs2_header, first.bare)
    salted = salted_password(mechanism, password, server.salt, server.iterations)
    without_proof = f"c={_b64(gs2.encode())},r={server.nonce}"
    auth = _auth_message(bare, server.text, without_proof)
    key = client_key(mechanism, salted)
    signature = _hmac(mechanism, _hash(mechanism, key), auth)
    proof = bytes(a ^ b for a, b in zip(key, signature, strict=True))
    server_signature = _hmac(mechanism, _hmac(mechanism, salted, b"Server Key"), auth)
    return f"{without_proof},p={_b64(proof)}".encode(), server_signature


def verify_client_final(mechanism: str, credential: ScramCredential, first: ClientFirst,
                        server_first_message: bytes, nonce: str, message: bytes) -> bytes:
    """The server-final message when the proof holds; ScramError otherwise."""
    text = _decode(message)
    head, sep, proof_text = text.rpartition(",p=")
    if not sep:
        raise ScramError("no proof")
    attrs = _attributes(head)
    if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
        raise ScramError("expected c=<binding>,r=<nonce>,...,p=<proof>")
    if attrs[0][1] != _b64(first.gs2_header.encode()):
        raise ScramError("the channel binding does not repeat the GS2 header")
    # Kafka's rule: the nonce must END with the one the server sent (librdkafka 2.0 sends
    # the client's nonce before it a second time, and Kafka takes it).
    sent = attrs[1][1].encode()
    if len(sent) < len(nonce) or not secrets.compare_digest(sent[len(sent) - len(nonce):],
                                                            nonce.encode()):
        raise ScramError("the nonce is not the one the server sent")
    proof = _unb64(proof_text)
    auth = _auth_message(first.bare, server_first_message.decode(), head)
    signature = _hmac(mechanism, credential.stored_key, auth)
    if len(proof) != len(signature):
        raise ScramError("a proof of the wrong length")
    key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    if not secrets.compare_digest(_hash(mechanism, key), credential.stored_key):
        raise ScramError("the proof does not match the credential")
    return f"v={_b64(_hmac(mechanism, credential.server_key, auth))}".encode()


def check_server_final(message: bytes, expected_signature: bytes) -> None:
    text = _decode(message)
    attrs = dict(_attributes(text))
    if "e" in attrs:
        raise ScramError(f"the server refused: {attrs['e']}")
    if not secrets.compare_digest(_unb64(attrs.get("v", "")), expected_signature):
        raise ScramError("the server's signature does not match: not the server we know")
