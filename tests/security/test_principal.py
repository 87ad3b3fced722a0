"""Principals parse from and print as Kafka's TYPE:NAME."""

import pytest

from oncelog.security.principal import ANONYMOUS, KafkaPrincipal


def test_principal_round_trips_through_text():
    assert str(KafkaPrincipal.parse("User:alice")) == "User:alice"
    assert KafkaPrincipal.parse("User:CN=a,O=b") == KafkaPrincipal("User", "CN=a,O=b")
    assert str(ANONYMOUS) == "User:ANONYMOUS"


@pytest.mark.parametrize("text", ["alice", ":alice", "User:", ""])
def test_principal_without_type_or_name_is_refused(text):
    with pytest.raises(ValueError):
        KafkaPrincipal.parse(text)
