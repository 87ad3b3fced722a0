"""security/scram.py, the SCRAM math both ends share: RFC 7677's own example exchange
(SCRAM-SHA-256), Kafka's stored form, both sides of the exchange against each other, and
anything a client may send is a ScramError or an answer, never another exception."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.metadata.store import LocalFileStore
from oncelog.security import scram
from oncelog.security.credentials import ScramCredentials
from oncelog.security.sasl_server import AuthenticationFailed, PlainServer, ScramServer

# RFC 7677 section 3
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
MECH = "SCRAM-SHA-256"


def test_the_client_side_computes_rfc_7677s_messages():
    server = scram.parse_server_first(RFC_SERVER_FIRST, "rOprNGfwEbeRWgbNEkqO")
    final, signature = scram.client_final(MECH, b"pencil", "n=user,r=rOprNGfwEbeRWgbNEkqO",
                                          server)
    assert final == RFC_CLIENT_FINAL
    scram.check_server_final(RFC_SERVER_FINAL, signature)


def test_the_server_side_verifies_rfc_7677s_exchange_from_the_credential_alone():
    credential = scram.make_credential(MECH, b"pencil", RFC_SALT, 4096)
    # what is stored: Kafka's text, and never the password
    text = credential.to_text()
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=") and "pencil" not in text
    assert scram.ScramCredential.from_text(text) == credential
    first = scram.parse_client_first(RFC_CLIENT_FIRST)
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    assert scram.server_first(nonce, credential) == RFC_SERVER_FIRST
    assert scram.verify_client_final(MECH, credential, first, RFC_SERVER_FIRST, nonce,
                                     RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    wrong = RFC_CLIENT_FINAL[:-6] + b"AAAAA="
    with pytest.raises(scram.ScramError, match="proof"):
        scram.verify_client_final(MECH, credential, first, RFC_SERVER_FIRST, nonce, wrong)


@pytest.fixture(scope="module")
def users(tmp_path_factory) -> ScramCredentials:
    return ScramCredentials(LocalFileStore(str(tmp_path_factory.mktemp("store"))))


@pytest.mark.parametrize("mechanism", list(scram.MECHANISMS))
def test_the_two_sides_agree_and_a_user_name_with_commas_is_escaped(users, mechanism):
    name = "a,b=c/d"
    users.put(name, mechanism, scram.make_credential(mechanism, b"secret"))
    users.put(name, "other", scram.make_credential(mechanism, b"x"))  # a quota-like key kept
    assert name in users.users() and users.mechanisms(name) == {mechanism: 4096}
    server = ScramServer(mechanism, users)
    first = scram.client_first(name, "cn")
    reply = server.step(first)
    parsed = scram.parse_server_first(reply, "cn")
    final, signature = scram.client_final(mechanism, b"secret", first.decode()[3:], parsed)
    scram.check_server_final(server.step(final), signature)
    assert server.done and server.username == name
    with pytest.raises(AuthenticationFailed):
        server.step(final)  # the exchange is over
    plain = PlainServer(users, None)
    plain.step(b"\0" + name.encode() + b"\0secret")
    assert plain.username == name
    with pytest.raises(AuthenticationFailed):
        PlainServer(users, None).step(b"\0" + name.encode() + b"\0wrong")
    assert users.delete(name, mechanism) and not users.delete(name, mechanism)


@settings(max_examples=60, deadline=None)
@given(first=st.binary(max_size=120), final=st.binary(max_size=200))
def test_whatever_a_client_sends_is_an_answer_or_a_refusal(users, first, final):
    if not users.mechanisms("user"):
        users.put("user", MECH, scram.make_credential(MECH, b"pencil", RFC_SALT, 4096))
    for tokens in ((first, final), (RFC_CLIENT_FIRST, final), (first,)):
        server = ScramServer(MECH, users)
        try:
            for token in tokens:
                server.step(token)
        except AuthenticationFailed:
            continue
        assert not server.done or server.username == "user"
    try:
        PlainServer(users, None).step(first)
    except AuthenticationFailed:
        pass


@pytest.mark.parametrize("iterations", [4095, 16385])
def test_iterations_outside_kafkas_bounds_are_refused(iterations):
    with pytest.raises(scram.ScramError):
        scram.make_credential(MECH, b"x", iterations=iterations)
