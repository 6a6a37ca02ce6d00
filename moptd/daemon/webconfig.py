"""TLS and basic authentication for /metrics, from a web configuration file in the format of
the Prometheus exporter toolkit (node_exporter's ``--web.config.file``), so one file serves
every exporter on a host:

    tls_server_config:
      cert_file: /etc/moptd/tls/moptd.crt
      key_file: /etc/moptd/tls/moptd.key
      client_auth_type: RequireAndVerifyClientCert   # optional; default NoClientCert
      client_ca_file: /etc/moptd/tls/ca.crt          # with a client_auth_type that verifies
      min_version: TLS12                             # optional; TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "")

Reference: https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md
A key moptd does not implement is refused, never ignored: a file that asks for mutual TLS and
got none would be a silent hole. The file is read at start; a broken one stops moptd with the
file, line and key, as node_exporter stops.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from moptd import yamlsafe
from moptd.config import ConfigError, read_regular_file

MAX_BYTES = 64 << 10

_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# upstream's modes that accept a client certificate without verifying it: Python's ssl
# verifies every certificate it asks for, so these are refused rather than half-done
_UNVERIFIED_CLIENT_AUTH = {"RequestClientCert", "RequireAnyClientCert"}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# the exporter toolkit's keys this module does not implement: refused by name
_NOT_HERE = {
    "http_server_config",
    "cipher_suites",
    "curve_preferences",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
    "cert",
    "key",
}


@dataclass(frozen=True)
class WebConfig:
    path: Path
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


class _Problem(Exception):
    def __init__(self, node: yaml.Node | None, key: str, message: str) -> None:
        super().__init__(message)
        self.line = node.start_mark.line + 1 if node is not None else 1
        self.key = key


def load_web_config(path: Path) -> WebConfig:
    """The parsed file, its certificates loaded; ConfigError naming file, line and key."""
    raw = read_regular_file(path, MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES} bytes; not a web configuration")
    try:
        root = yamlsafe.compose(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from exc
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise ConfigError(f"{path}:{line}: YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}:1: YAML: {exc}") from exc
    try:
        return _build(path, root)
    except _Problem as p:
        raise ConfigError(f"{path}:{p.line}: key {p.key!r}: {p}") from None


def _mapping(node: yaml.Node | None, key: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if node is None or (isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~")):
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise _Problem(node, key, "must be a mapping")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            raise _Problem(k, key, "keys must be strings")
        out[k.value] = (k, v)
    return out


def _string(node: yaml.Node, key: str) -> str:
    if not isinstance(node, yaml.ScalarNode) or not node.value.strip():
        raise _Problem(node, key, "must be a non-empty string")
    return str(node.value)


def _build(path: Path, root: yaml.Node | None) -> WebConfig:
    top = _mapping(root, "")
    for name, (k, _) in top.items():
        if name not in ("tls_server_config", "basic_auth_users"):
            why = "not implemented by moptd" if name in _NOT_HERE else "unknown key"
            raise _Problem(k, name, why)
    ctx = None
    if "tls_server_config" in top:
        k, v = top["tls_server_config"]
        ctx = _tls(path, _mapping(v, "tls_server_config"), k)
    users: dict[str, bytes] = {}
    if "basic_auth_users" in top:
        for user, (_, uv) in _mapping(top["basic_auth_users"][1], "basic_auth_users").items():
            key = f"basic_auth_users.{user}"
            hashed = _string(uv, key).encode()
            if not hashed.startswith((b"$2a$", b"$2b$", b"$2y$")) or len(hashed) != 60:
                raise _Problem(uv, key, "must be a bcrypt hash ($2y$..., 60 characters)")
            users[user] = hashed
        if users:
            _bcrypt(top["basic_auth_users"][0])
    return WebConfig(path, ctx, users)


def _tls(path: Path, tls: dict[str, tuple[yaml.Node, yaml.Node]], at: yaml.Node) -> ssl.SSLContext:
    for name, (k, _) in tls.items():
        if name not in _TLS_KEYS:
            why = "not implemented by moptd" if name in _NOT_HERE else "unknown key"
            raise _Problem(k, f"tls_server_config.{name}", why)
    for need in ("cert_file", "key_file"):
        if need not in tls:
            raise _Problem(at, f"tls_server_config.{need}", "required with tls_server_config")

    def file_of(name: str) -> str:
        text = _string(tls[name][1], f"tls_server_config.{name}")
        p = Path(text)
        return str(p if p.is_absolute() else path.parent / p)  # relative to the file, as upstream

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = "TLS12"
    if "min_version" in tls:
        version = _string(tls["min_version"][1], "tls_server_config.min_version")
        if version not in _VERSIONS:
            raise _Problem(
                tls["min_version"][1],
                "tls_server_config.min_version",
                f"{version!r} is not one of {', '.join(_VERSIONS)}",
            )
    ctx.minimum_version = _VERSIONS[version]
    try:
        ctx.load_cert_chain(file_of("cert_file"), file_of("key_file"))
    except (OSError, ssl.SSLError) as exc:
        raise _Problem(
            tls["cert_file"][1],
            "tls_server_config.cert_file",
            f"cannot load the certificate and key: {exc}",
        ) from None
    mode = "NoClientCert"
    if "client_auth_type" in tls:
        mode = _string(tls["client_auth_type"][1], "tls_server_config.client_auth_type")
        if mode in _UNVERIFIED_CLIENT_AUTH:
            raise _Problem(
                tls["client_auth_type"][1],
                "tls_server_config.client_auth_type",
                f"{mode} is not implemented by moptd (it cannot accept a client "
                "certificate it does not verify); use RequireAndVerifyClientCert",
            )
        if mode not in _CLIENT_AUTH:
            raise _Problem(
                tls["client_auth_type"][1],
                "tls_server_config.client_auth_type",
                f"{mode!r} is not one of {', '.join(_CLIENT_AUTH)}",
            )
    ctx.verify_mode = _CLIENT_AUTH[mode]
    if mode in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        if "client_ca_file" not in tls:
            raise _Problem(
                tls["client_auth_type"][1],
                "tls_server_config.client_ca_file",
                f"required with client_auth_type {mode}",
            )
        try:
            ctx.load_verify_locations(file_of("client_ca_file"))
        except (OSError, ssl.SSLError) as exc:
            raise _Problem(
                tls["client_ca_file"][1], "tls_server_config.client_ca_file", f"cannot load: {exc}"
            ) from None
    return ctx


def _bcrypt(at: yaml.Node | None) -> Any:
    try:
        import bcrypt
    except ImportError:
        raise _Problem(
            at, "basic_auth_users", "needs the bcrypt package (pip install 'moptd[web]')"
        ) from None
    return bcrypt


class BasicAuth:
    """aiohttp middleware: 401 unless the request carries one of the users' passwords.
    bcrypt is slow on purpose (about 50 ms at cost 10), so a check runs in a thread, one at a
    time, and a password that passed is remembered by its SHA-256, as the exporter toolkit
    caches, so Prometheus's scrape every 15 s costs one check in all."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        self._bcrypt = _bcrypt(None)
        self._passed: set[tuple[str, bytes]] = set()
        self._one_at_a_time = asyncio.Semaphore(1)

    async def check(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
            user, sep, password = decoded.partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if not sep or hashed is None:
            return False
        key = (user, hashlib.sha256(password.encode()).digest())
        if any(u == key[0] and hmac.compare_digest(d, key[1]) for u, d in self._passed):
            return True
        async with self._one_at_a_time:
            ok = await asyncio.to_thread(self._bcrypt.checkpw, password.encode(), hashed)
        if ok:
            self._passed.add(key)
        return bool(ok)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if await self.check(request.headers.get("Authorization", "")):
            return await handler(request)
        return web.Response(
            status=401, text="Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="moptd"'}
        )
