"""A bare Kafka connection to one listener of the secured broker (tests/support/secured.py):
requests as a hostile or hand-driven client chooses them, SASL by hand."""

from __future__ import annotations

import socket
import ssl
import struct

from oncelog.protocol import api_versions as apis
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.schema import build, request_module

TIMEOUT = 30.0


class Raw:
    """A bare Kafka connection (to the SASL_PLAINTEXT listener unless told): requests as we
    choose them."""

    def __init__(self, secured, listener: str = "SASL_PLAINTEXT",
                 context: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", secured.broker.ports[listener]),
                                             TIMEOUT)
        if context is not None:
            self.sock = context.wrap_socket(self.sock, server_hostname="localhost")
        self.correlation = 0

    def call(self, api_key: int, version: int, **fields):
        self.correlation += 1
        mod = request_module(api_key, version)
        name = next(n for n in vars(mod) if n.endswith("Request") and n != "Request")
        self.sock.sendall(encode_request(api_key, version, self.correlation, "hostile",
                                         build(getattr(mod, name), **fields)))
        size = struct.unpack(">i", self._read(4))[0]
        return decode_response(api_key, version, self._read(size))[1]

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def handshake(self, mechanism: str = "SCRAM-SHA-256"):
        return self.call(apis.SASL_HANDSHAKE, 1, mechanism=mechanism)

    def token(self, data: bytes, version: int = 2):
        return self.call(apis.SASL_AUTHENTICATE, version, auth_bytes=data)
