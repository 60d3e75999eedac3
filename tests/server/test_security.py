"""Security: loopback by default, TLS and a bearer token for anything else, 0600 files.

TLS runs for real on 127.0.0.1 with a self-signed certificate made by ``openssl`` for the
test; the token is checked by the server's interceptor on every call but health.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cli.main import main
from server.app import build_server, stop_server
from server.client import TunerClient
from server.security import ServerSecurity, is_loopback
from server.service import TuningService
from server.storage import SQLiteStorage
from tuner.errors import ValidationError
from tuner.space import FloatKnob, SearchSpace
from tuner.study import DesignerSettings, Goal, Objective, StudySpec

TOKEN = "s3cret-token-0123456789"
SPEC = StudySpec(
    name="secured",
    space=SearchSpace((FloatKnob("x", low=0.0, high=1.0, default=0.5),)),
    objectives=(Objective("y", Goal.MINIMIZE),),
    designer=DesignerSettings(algorithm="sobol", start_with_default=False),
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("system package openssl is not installed (makes the test certificate)")
    folder = tmp_path_factory.mktemp("pki")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    token = folder / "token"
    token.write_text(TOKEN + "\n")
    return {"cert": cert, "key": key, "token": token}


@pytest.fixture
def secured(pki: dict[str, Path], tmp_path: Path) -> Iterator[str]:
    storage = SQLiteStorage(tmp_path / "tuner.db")
    security = ServerSecurity.from_files(pki["cert"], pki["key"], pki["token"])
    server, port = build_server(TuningService(storage), "127.0.0.1", 0, security=security)
    server.start()
    yield f"127.0.0.1:{port}"
    stop_server(server, None).wait()
    storage.close()


def test_a_client_with_the_certificate_and_the_token_gets_in(
    secured: str, pki: dict[str, Path]
) -> None:
    with TunerClient(secured, tls_ca=pki["cert"].read_bytes(), token=TOKEN) as client:
        client.wait_ready(10)
        _, created = client.create_study(SPEC)
        assert created and [s.spec.name for s in client.list_studies()] == ["secured"]


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", TOKEN[:-1]])
def test_a_missing_or_wrong_token_is_unauthenticated(
    secured: str, pki: dict[str, Path], token: str | None
) -> None:
    with TunerClient(secured, tls_ca=pki["cert"].read_bytes(), token=token, retry_for=0) as c:
        c.wait_ready(10)  # health stays open for probes
        with pytest.raises(grpc.RpcError) as caught:
            c.list_studies()
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in (caught.value.details() or "")


def test_a_plain_text_client_cannot_talk_to_a_tls_server(secured: str) -> None:
    client = TunerClient(secured, token=TOKEN, retry_for=0, timeout=5)
    with client, pytest.raises(grpc.RpcError) as caught:
        client.list_studies()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("files", "missing"),
    [((), "--tls-cert/--tls-key and --token-file"), (("token",), "--tls-cert/--tls-key"),
     (("cert", "key"), "--token-file")],
)  # fmt: skip
def test_binding_beyond_loopback_needs_tls_and_a_token(
    pki: dict[str, Path], tmp_path: Path, files: tuple[str, ...], missing: str
) -> None:
    security = ServerSecurity.from_files(**{k: pki[k] for k in files})
    with pytest.raises(ValidationError) as caught:
        build_server(TuningService(SQLiteStorage(tmp_path / "x.db")), "0.0.0.0", 0,
                     security=security)  # fmt: skip
    assert caught.value.field == "--host" and f"missing {missing}" in str(caught.value)


def test_tuner_serve_refuses_a_public_address_before_touching_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    code = main(["serve", "--db", str(db), "--host", "0.0.0.0", "--port", "0"])
    assert code == 1 and not db.exists()
    assert "--host" in capsys.readouterr().err


def test_cli_commands_reach_a_secured_server(
    secured: str, pki: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--server", secured, "--tls-ca", str(pki["cert"])]
    assert main(["studies", *options, "--token-file", str(pki["token"])]) == 0
    assert main(["studies", *options]) == 1
    assert "bearer token" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
     ("example.invalid", False)],
)  # fmt: skip
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_lone_key_or_an_empty_token_file_is_named(pki: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        ServerSecurity.from_files(cert=pki["cert"])
    assert caught.value.field == "--tls-cert"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValidationError) as caught:
        ServerSecurity.from_files(token=empty)
    assert caught.value.field == "--token-file"


def test_the_database_file_is_private(tmp_path: Path) -> None:
    SQLiteStorage(tmp_path / "new.db").close()
    assert stat.S_IMODE((tmp_path / "new.db").stat().st_mode) == 0o600
