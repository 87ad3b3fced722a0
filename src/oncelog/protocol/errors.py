"""Protocol-level failures: the peer must be disconnected (or told UNSUPPORTED_VERSION)."""


class ProtocolError(Exception):
    """The peer broke the protocol; the connection must be closed."""


class UnsupportedVersion(ProtocolError):
    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
