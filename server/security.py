"""Who may talk to the server: loopback by default, TLS and a bearer token otherwise.

The API changes what runs on real systems, so the server binds ``127.0.0.1`` unless told
otherwise, and binding any other address needs both TLS (``--tls-cert``, ``--tls-key``) and
a bearer token (``--token-file``): TLS alone would let anyone who reaches the port in, a
token alone would travel in clear text. On loopback both stay optional (a token can still be
required).

``TokenInterceptor`` checks ``authorization: Bearer <token>`` on every call with a
constant-time comparison and answers UNAUTHENTICATED otherwise; the standard health service
stays open so that load balancers and ``grpc_health_probe`` work without the secret. Token
files are read once at start, stripped of surrounding whitespace, and must not be empty.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tuner.errors import ValidationError

HEALTH_PREFIX = "/grpc.health.v1.Health/"


@dataclass(frozen=True)
class ServerSecurity:
    """TLS key pair and bearer token of a server (either may be absent on loopback).

    Attributes:
        cert: PEM certificate chain the server presents.
        key: PEM private key of ``cert``.
        token: The bearer token every call must carry.
    """

    cert: bytes | None = None
    key: bytes | None = None
    token: str | None = None

    @classmethod
    def from_files(
        cls,
        cert: Path | None = None,
        key: Path | None = None,
        token: Path | None = None,
        token_option: str = "--token-file",
    ) -> ServerSecurity:
        """Read the files given (``--tls-cert``, ``--tls-key``, ``token_option``).

        Raises:
            ValidationError: Only one of cert and key, a file that cannot be read, or an
                empty token file; the field is the command-line option.
        """
        if (cert is None) != (key is None):
            raise ValidationError("--tls-cert", "needs --tls-key too (and the other way round)")
        return cls(
            cert=read_file(cert, "--tls-cert") if cert else None,
            key=read_file(key, "--tls-key") if key else None,
            token=read_token(token, token_option) if token else None,
        )

    @property
    def tls(self) -> bool:
        return self.cert is not None and self.key is not None

    def check_host(self, host: str, token_option: str = "--token-file") -> None:
        """Refuse to expose the API beyond loopback without TLS and a token.

        Raises:
            ValidationError: ``host`` is not a loopback address and TLS or the token is
                missing (field ``--host``; ``token_option`` names the token's option).
        """
        check_exposure(host, self.tls, self.token is not None, token_option)

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        assert self.cert is not None and self.key is not None
        return grpc.ssl_server_credentials([(self.key, self.cert)])

    def interceptors(self) -> list[grpc.ServerInterceptor]:
        return [TokenInterceptor(self.token)] if self.token else []


class TokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Lets a call through only with ``authorization: Bearer <token>`` (health is open)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong bearer token (metadata 'authorization: Bearer <token>')",
            )

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method.startswith(HEALTH_PREFIX):
            return continuation(details)
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        sent_bytes = sent.encode() if isinstance(sent, str) else bytes(sent)
        if hmac.compare_digest(sent_bytes, self._expected):
            return continuation(details)
        return self._deny


def check_exposure(host: str, tls: bool, token: bool, token_option: str = "--token-file") -> None:
    """The rule of every listener (the gRPC server, the dashboard): beyond loopback, TLS and
    a token, or nothing.

    Raises:
        ValidationError: ``host`` is not a loopback address and TLS or the token is missing
            (field ``--host``).
    """
    if is_loopback(host):
        return
    needed = (("--tls-cert/--tls-key", tls), (token_option, token))
    missing = [option for option, given in needed if not given]
    if missing:
        raise ValidationError(
            "--host",
            f"binding {host!r} (not loopback) requires TLS and a bearer token; "
            f"missing {' and '.join(missing)}",
            "127.0.0.1 / ::1 / localhost, or another address with --tls-cert, --tls-key "
            f"and {token_option}",
        )


def is_loopback(host: str, resolve: bool = True) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``).

    Args:
        resolve: Look a host name up (it is loopback if every address it has is). Without,
            only ``localhost`` and loopback addresses count: what a request's ``Host``
            header may say, since a name that resolves to loopback now may be an
            attacker's (DNS rebinding).
    """
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        if not resolve:
            return False
        try:  # a host name: loopback only if every address it resolves to is
            infos = socket.getaddrinfo(name, None)
        except OSError:
            return False
        return bool(infos) and all(
            ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
        )


def read_token(path: Path, option: str) -> str:
    token = read_file(path, option).decode("utf-8", "replace").strip()
    if not token or any(c.isspace() for c in token):
        raise ValidationError(option, f"{path} holds no token (one line, no spaces)")
    return token


def read_file(path: Path, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValidationError(option, f"cannot read {path}: {exc.strerror}") from None
