"""The native network client is one concept: one SUT kind (``SutKind.net_client``), one
settings type whose ``protocol`` says HTTP/1.1 or gRPC, and SUTs that ask for the protocol
they speak. No server: the settings are checked when an engine is made, before anything
connects."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loadgen import _core
from loadgen.net.native import NativeClientSUT, NativeGrpcSUT, NativeHttpSUT, NativeOpenAISUT
from loadgen.sut.forms import classify_sut
from tests.helpers import net_client_engine


def _settings(protocol, requests=(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",), **fields):
    h = _core.NetClientSettings()
    h.protocol = protocol
    h.host, h.port = "127.0.0.1", 9  # nothing is connected before the run starts
    h.requests = list(requests)
    for k, v in fields.items():
        setattr(h, k, v)
    return h


def _prepared(cls, tls=False, **inner):
    """A native SUT over a stand-in for a prepared client: what client_settings() reads."""
    sut = cls.__new__(cls)
    sut.inner = SimpleNamespace(target=SimpleNamespace(port=8000, tls=tls, host="svc.example"), connections=3,
                                requests=[b"r"], net=SimpleNamespace(max_response_bytes=1 << 20, ca_file="/ca.pem",
                                                                     insecure=False), timeout_ns=0, **inner)
    sut.host, sut.io_threads, sut.cpus = "127.0.0.1", 1, []
    return sut


def test_one_sut_kind_and_no_binding_names_the_client_http():
    assert "net_client" in _core.SutKind.__members__
    assert not {"http", "grpc"} & set(_core.SutKind.__members__)
    assert set(_core.NetProtocol.__members__) == {"http1", "grpc"}
    assert not hasattr(_core, "HttpClientSettings")
    assert not [n for n in dir(_core.Engine) if n.startswith("http")]
    assert "grpc_path" not in dir(_core.NetClientSettings)
    assert _core.NetClientSettings().protocol == _core.NetProtocol.http1


def test_the_grpc_sut_asks_for_the_grpc_protocol_and_its_method():
    pytest.importorskip("google.protobuf")
    sut = _prepared(NativeGrpcSUT, metadata_md=[("x-key", "v")])
    sut.max_calls = 8
    s = sut.native_settings()
    assert s.kind == _core.SutKind.net_client
    assert s.net.protocol == _core.NetProtocol.grpc
    assert s.net.grpc_method == "/inference.GRPCInferenceService/ModelInfer"
    assert (s.net.metadata, s.net.max_in_flight, s.net.warm_connections) == ([("x-key", "v")], 8, 3)


@pytest.mark.parametrize("cls", [NativeHttpSUT, NativeOpenAISUT])
def test_the_http_suts_ask_for_http1(cls):
    sut = _prepared(cls)
    s = sut.client_settings() if cls is NativeHttpSUT else NativeHttpSUT.client_settings(sut)
    assert s.protocol == _core.NetProtocol.http1
    assert s.grpc_method == ""


@pytest.mark.parametrize("cls", [NativeHttpSUT, NativeOpenAISUT, NativeGrpcSUT])
def test_every_native_client_sut_is_the_native_client_form(cls):
    assert issubclass(cls, NativeClientSUT)
    assert classify_sut(cls.__new__(cls)) == "native_client"


def test_a_grpc_client_needs_its_method_path():
    with pytest.raises(ValueError, match=r"net\.grpc_method must be a method's path"):
        net_client_engine(_settings(_core.NetProtocol.grpc, requests=[b"\x00"]))


def test_grpc_requests_are_messages_not_request_lines():
    """The request-line check is HTTP/1.1's: the same bytes are refused as HTTP/1.1
    requests and pass it as gRPC messages (where the method's path is what is checked)."""
    message = b"\x0a\x01m"  # a serialized protobuf, no request line
    with pytest.raises(ValueError, match=r"net\.requests\[0\]: the request line"):
        net_client_engine(_settings(_core.NetProtocol.http1, requests=[message]))
    with pytest.raises(ValueError, match=r"net\.grpc_method"):
        net_client_engine(_settings(_core.NetProtocol.grpc, requests=[message], grpc_method="nope"))
    if _core.grpc_client_available():
        net_client_engine(_settings(_core.NetProtocol.grpc, requests=[message], grpc_method="/p.S/M"))


def test_http1_only_fields_are_refused_for_grpc():
    with pytest.raises(ValueError, match=r"net\.sse and net\.head_only are HTTP/1\.1's"):
        net_client_engine(_settings(_core.NetProtocol.grpc, requests=[b"m"], grpc_method="/p.S/M", sse=True))


def test_loadgen_env_says_the_native_client_has_http1_and_whether_it_has_grpc_and_tls():
    from loadgen.cli.env import native_clients

    got = native_clients()
    assert got["http"] is True
    assert got["grpc"] is _core.grpc_client_available()
    assert got["tls"] is _core.tls_available()
    assert (got["openssl"] or "").startswith("OpenSSL") is _core.tls_available()


def test_a_tls_target_asks_for_tls_with_its_host_name_and_ca():
    h = _prepared(NativeHttpSUT, tls=True).client_settings()
    assert h.tls and h.server_name == "svc.example" and h.ca_file == "/ca.pem" and not h.insecure
    assert not _prepared(NativeHttpSUT).client_settings().tls


def test_tls_is_no_reason_to_refuse_where_the_core_has_it():
    from loadgen.net.native import grpc_refusal, http_refusal
    from loadgen.net.targets import parse_target

    https, grpcs = parse_target("https://127.0.0.1:8443/v2/models/m/infer"), parse_target("grpcs://127.0.0.1:8443/m")
    if _core.tls_available():
        assert http_refusal(https) is None
        assert grpc_refusal(grpcs) == grpc_refusal(parse_target("grpc://127.0.0.1:8443/m"))
    else:
        assert "OpenSSL" in (http_refusal(https) or "") and "OpenSSL" in (grpc_refusal(grpcs) or "")


@pytest.mark.skipif(not _core.tls_available(), reason="a build without OpenSSL")
def test_a_ca_file_that_does_not_load_is_named_when_the_client_is_made():
    with pytest.raises(RuntimeError, match="--ca-file: cannot load /nonexistent/ca.pem"):
        net_client_engine(_settings(_core.NetProtocol.http1, tls=True, ca_file="/nonexistent/ca.pem"))


def test_request_groups_are_one_per_request_and_within_the_group_count():
    """A model mix's groups: one per prepared request, each one of the group_count groups."""
    two = [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"] * 2
    with pytest.raises(ValueError, match=r"net\.request_groups must be empty or hold one group per request"):
        net_client_engine(_settings(_core.NetProtocol.http1, requests=two, group_count=2, request_groups=[0]))
    with pytest.raises(ValueError, match=r"net\.request_groups: group 2 is outside 0\.\.1"):
        net_client_engine(_settings(_core.NetProtocol.http1, requests=two, group_count=2, request_groups=[0, 2]))
    net_client_engine(_settings(_core.NetProtocol.http1, requests=two, group_count=2, request_groups=[1, 0]))


def test_a_model_mix_is_no_reason_to_refuse_the_native_client():
    from loadgen.net.native import http_refusal

    chat = SimpleNamespace(kind="openai", tls=False, endpoint="chat", path="/v1/chat/completions")
    assert http_refusal(chat, SimpleNamespace(model="base=3,lora-a=1")) is None
