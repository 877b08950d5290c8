"""API keys (docs/SECURITY.md): who may use the gateway, checked once for every protocol.

`API_KEYS` (comma-separated) and `API_KEYS_FILE` (one key per line, `key:name` to name it;
re-read on SIGHUP) give the keys; with neither, the gateway is open. A request presents its
key the way its protocol's clients send one: `Authorization: Bearer <key>` (OpenAI clients,
huggingface_hub's `token=`), `X-Api-Key`, and for WebSockets, which a browser opens without
headers, a `Sec-WebSocket-Protocol` entry `bearer.<key>` (echoed as the accepted subprotocol)
or the `api_key` query parameter. Keys are compared in constant time and never logged: a
key is known by its name, or by a short hash when it has none.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qs

from starlette.types import Scope

from gateway.config import ConfigError

log = logging.getLogger(__name__)
SUBPROTOCOL_PREFIX = "bearer."


def key_label(key: str) -> str:
    """What logs and metrics call a key that has no name: a short hash, never the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def parse_keys(inline: str, file_text: str = "") -> dict[str, str]:
    """Key -> name, from API_KEYS and the keys file's text (`#` starts a comment line)."""
    keys: dict[str, str] = {}
    entries: Iterable[str] = [*inline.split(","), *file_text.splitlines()]
    for entry in (e.strip() for e in entries):
        if not entry or entry.startswith("#"):
            continue
        key, _, name = entry.partition(":")
        key = key.strip()
        if key:
            keys[key] = name.strip() or key_label(key)
    return keys


class KeyRing:
    """The keys in force; `reload()` re-reads the file (SIGHUP)."""

    def __init__(self, inline: str, file: str = "") -> None:
        self._inline = inline
        self._file = Path(file) if file else None
        try:
            self._keys = self._read()
        except OSError as e:
            raise ConfigError(f"API_KEYS_FILE: cannot read {file}: {e}") from e

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def reload(self) -> None:
        try:
            self._keys = self._read()
        except OSError as e:  # keep the keys in force rather than open the gateway
            log.error("API keys not reloaded, %s unreadable: %s", self._file, e)
            return
        log.info("API keys reloaded: %d keys", len(self._keys))

    def _read(self) -> dict[str, str]:
        text = self._file.read_text() if self._file is not None else ""
        return parse_keys(self._inline, text)

    def name_of(self, presented: str | None) -> str | None:
        """The presented key's name, or None when it is no key of ours.

        Every key is compared, in constant time each, so the time taken says nothing about
        which key came close."""
        found = None
        given = (presented or "").encode()
        for key, name in self._keys.items():
            if hmac.compare_digest(key.encode(), given) and presented:
                found = name
        return found


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def subprotocol_key(scope: Scope) -> str | None:
    """The key a browser offered as a `bearer.<key>` WebSocket subprotocol."""
    for protocol in scope.get("subprotocols", ()):
        if protocol.startswith(SUBPROTOCOL_PREFIX):
            return str(protocol[len(SUBPROTOCOL_PREFIX) :])
    return None


def presented_key(scope: Scope) -> str | None:
    """The key a request presents, however its protocol's clients send it."""
    authorization = _header(scope, b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = _header(scope, b"x-api-key")
    if api_key:
        return api_key
    if scope["type"] == "websocket":
        offered = subprotocol_key(scope)
        if offered:
            return offered
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        if query.get("api_key"):
            return query["api_key"][0]
    return None
