"""API keys (docs/SECURITY.md): who may use the gateway, checked once for every protocol.

`API_KEYS` (comma-separated) and `API_KEYS_FILE` (one key per line, `key:name` to name it,
then optional limit overrides `concurrent=2 rpm=30 tpm=5000`; re-read on SIGHUP) give the
keys; with neither, the gateway is open. A request presents its
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
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import parse_qs

from starlette.types import Scope

from gateway.config.settings import ConfigError
from gateway.edge.limits import NO_LIMITS, OVERRIDE_NAMES, Limits

log = logging.getLogger(__name__)
SUBPROTOCOL_PREFIX = "bearer."


def key_digest(key: str) -> str:
    """Who a key is, for ownership and limits: its whole SHA-256, so two keys never share."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_label(key: str) -> str:
    """What logs and metrics call a key that has no name: a short hash, never the key. Short
    (32 bits) keys collide: a label only names, it never owns."""
    return "key-" + key_digest(key)[:8]


@dataclass(frozen=True)
class KeyEntry:
    name: str  # for logs: the given name, else the label
    label: str  # a short hash of the key: safe to show, but not unique
    owner: str  # the key's whole SHA-256: its histories, request ids and limits
    limits: Limits


def parse_keys(
    inline: str, file_text: str = "", defaults: Limits = NO_LIMITS
) -> dict[str, KeyEntry]:
    """Key -> entry, from API_KEYS and the keys file's text (`#` starts a comment line)."""
    keys: dict[str, KeyEntry] = {}
    entries: Iterable[str] = [*inline.split(","), *file_text.splitlines()]
    for entry in (e.strip() for e in entries):
        if not entry or entry.startswith("#"):
            continue
        head, *overrides = entry.split()
        key, _, name = head.partition(":")
        if key:
            label = key_label(key)
            limits = _overridden(defaults, overrides, name or label)
            keys[key] = KeyEntry(name or label, label, key_digest(key), limits)
    return keys


def _overridden(defaults: Limits, overrides: list[str], name: str) -> Limits:
    values: dict[str, int] = {}
    for item in overrides:
        field, _, value = item.partition("=")
        if field not in OVERRIDE_NAMES or not value.isdigit():
            raise ConfigError(
                f"API keys: key {name!r} has {item!r}; limits are written "
                "concurrent=N, rpm=N or tpm=N (0: no limit)"
            )
        values[OVERRIDE_NAMES[field]] = int(value)
    return replace(defaults, **values)


class KeyRing:
    """The keys in force; `reload()` re-reads the file (SIGHUP)."""

    def __init__(self, inline: str, file: str = "", defaults: Limits = NO_LIMITS) -> None:
        self._inline = inline
        self._defaults = defaults
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
        except (OSError, ConfigError) as e:  # keep the keys in force rather than open the gateway
            log.error("API keys not reloaded from %s: %s", self._file, e)
            return
        log.info("API keys reloaded: %d keys", len(self._keys))

    def _read(self) -> dict[str, KeyEntry]:
        text = self._file.read_text() if self._file is not None else ""
        return parse_keys(self._inline, text, self._defaults)

    def entry_of(self, presented: str | None) -> KeyEntry | None:
        """The presented key's entry, or None when it is no key of ours.

        Every key is compared, in constant time each, so the time taken says nothing about
        which key came close."""
        found = None
        given = (presented or "").encode()
        for key, entry in self._keys.items():
            if hmac.compare_digest(key.encode(), given) and presented:
                found = entry
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
    """The key a request presents, however its protocol's clients send it: a protocol whose
    clients send it another way adds that way here (tests/test_protocol_tables.py)."""
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
