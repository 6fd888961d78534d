"""Who may ask for what: the gateway's callers, from their API keys.

A caller is a tenant and the SLO classes it may use. The gateway finds it one of three ways:

- **keys** (``TOKENFLEET_API_KEYS`` names a key file): every call carries ``Authorization: Bearer
  <key>``, as OpenAI clients send their API key. The file holds each key's SHA-256, never the key:

  .. code-block:: yaml

      keys:
        - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
          tenant: acme
          slo_classes: [interactive, batch]   # the classes this tenant may ask for
          name: ci                            # optional: who holds it, for the logs

  The tenant is the key's; nothing the caller sets changes it (an ``X-TokenFleet-Tenant`` naming
  another tenant is refused, the body's ``user`` only names a session, hashed with the tenant).
  No key or an unknown one is 401 (``invalid_api_key``); asking for a class the key does not
  list is 403. The file is read again when it changes (an operator adds or revokes a key without
  a restart; a mounted secret updates the same way); a change that does not parse is logged and
  the keys before it stay.
  ``new_key`` makes a key and its entry, ``add_key`` appends one to a file.
- **proxy** (``TOKENFLEET_TRUST_TENANT_HEADER=true``): the gateway sits behind a proxy that
  authenticates the callers and names their tenant in ``X-TokenFleet-Tenant``; the gateway takes
  the tenant from that header (a call without it is 401) and lets it use any class. Only for a
  gateway nobody reaches except through that proxy. A key file is not read in this mode (setting
  both is a configuration error).
- **open** (neither): no authentication. Every call is the tenant ``default`` with any class;
  ``X-TokenFleet-Tenant``, the body's ``user`` and any ``Authorization`` are ignored for tenancy,
  so no caller can take another tenant's quota, fair share, tier, reservation or residency. The
  gateway logs one warning at start that authentication is off. This is how a gateway without a
  key file ran before keys existed, minus the tenant a caller could name.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from gateway.openai_api import ApiError
from infra.files import write_atomic

log = logging.getLogger(__name__)

Mode = Literal["keys", "proxy", "open"]
OPEN_TENANT = "default"
TENANT_HEADER = "X-TokenFleet-Tenant"
KEY_PREFIX = "tf-"
MAX_TENANT_LENGTH = 256
_ENTRY_FIELDS = {"sha256", "tenant", "slo_classes", "name"}


class KeyFileError(ValueError):
    """The key file cannot be read or does not describe keys."""


@dataclass(frozen=True)
class KeyEntry:
    """One API key as the key file holds it: its hash, whose it is, what it may ask for."""

    sha256: str
    tenant: str
    slo_classes: tuple[str, ...]
    name: str = ""

    def as_yaml(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "sha256": self.sha256,
            "tenant": self.tenant,
            "slo_classes": list(self.slo_classes),
        }
        if self.name:
            entry["name"] = self.name
        return entry


@dataclass(frozen=True)
class Caller:
    """Who made a call: its tenant, the SLO classes it may use (None: any) and, with a key, the
    key's name."""

    tenant: str
    slo_classes: tuple[str, ...] | None = None
    key_name: str = ""

    def may_use(self, slo_class: str) -> bool:
        return self.slo_classes is None or slo_class in self.slo_classes


def key_hash(key: str) -> str:
    """The hex SHA-256 of a key: what the key file stores."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(tenant: str, slo_classes: Sequence[str], name: str = "") -> tuple[str, KeyEntry]:
    """A fresh key (``tf-`` and 256 random bits) and its key-file entry. Show the key once to
    whoever will use it; store only the entry."""
    entry = _entry({"tenant": tenant, "slo_classes": list(slo_classes), "name": name, "sha256": "0" * 64})
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, KeyEntry(key_hash(key), entry.tenant, entry.slo_classes, entry.name)


def add_key(
    path: Path, tenant: str, slo_classes: Sequence[str], name: str = "", known_classes: Collection[str] = ()
) -> str:
    """Make a key for ``tenant``, append its entry to the key file ``path`` (created, readable by
    its owner only, if missing) and return the key: the only time it is seen in clear.
    ``known_classes``: if given, the classes must be among them."""
    key, entry = new_key(tenant, slo_classes, name)
    if known_classes:
        _check_classes(entry, known_classes)
    entries = [e.as_yaml() for e in load_keys(path)] if path.exists() else []
    entries.append(entry.as_yaml())
    text = "# TokenFleet gateway API keys: SHA-256 of each key (tokenfleet gateway reads this)\n"
    text += yaml.safe_dump({"keys": entries}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o600)
    return key


def load_keys(path: Path, known_classes: Collection[str] = ()) -> list[KeyEntry]:
    """The entries of the key file ``path``; ``KeyFileError`` says what is wrong. ``known_classes``:
    if given, every entry's classes must be among them (a typo is an error, not a class nobody
    can use)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KeyFileError(f"the API key file {path} is not valid YAML: {_first_line(exc)}") from None
    if not isinstance(raw, dict) or set(raw) != {"keys"} or not isinstance(raw["keys"], list | None):
        raise KeyFileError(f"the API key file {path} must be a mapping with one list, 'keys'")
    entries = []
    for index, item in enumerate(raw["keys"] or ()):
        try:
            entry = _entry(item)
            if known_classes:
                _check_classes(entry, known_classes)
        except KeyFileError as exc:
            raise KeyFileError(f"the API key file {path}: keys[{index}]: {exc}") from None
        entries.append(entry)
    hashes = [e.sha256 for e in entries]
    if len(set(hashes)) != len(hashes):
        raise KeyFileError(f"the API key file {path} lists a key twice")
    return entries


def _entry(item: Any) -> KeyEntry:
    if not isinstance(item, dict):
        raise KeyFileError("must be a mapping")
    unknown = sorted(set(item) - _ENTRY_FIELDS, key=str)
    if unknown:
        raise KeyFileError(f"unknown fields {unknown}; known: {', '.join(sorted(_ENTRY_FIELDS))}")
    digest = item.get("sha256")
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or any(c not in "0123456789abcdefABCDEF" for c in digest)
    ):
        raise KeyFileError("'sha256' must be the 64 hex digits of the key's SHA-256")
    tenant = item.get("tenant")
    if not isinstance(tenant, str) or not _printable(tenant, MAX_TENANT_LENGTH):
        raise KeyFileError(f"'tenant' must be a name of 1 to {MAX_TENANT_LENGTH} printable characters")
    classes = item.get("slo_classes")
    if (
        not isinstance(classes, list)
        or not classes
        or not all(isinstance(c, str) and _printable(c, MAX_TENANT_LENGTH) for c in classes)
    ):
        raise KeyFileError("'slo_classes' must be a non-empty list of SLO class names")
    name = item.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_TENANT_LENGTH:
        raise KeyFileError(f"'name' must be a string of at most {MAX_TENANT_LENGTH} characters")
    return KeyEntry(digest.lower(), tenant, tuple(dict.fromkeys(classes)), name)


def _check_classes(entry: KeyEntry, known: Collection[str]) -> None:
    unknown = [c for c in entry.slo_classes if c not in known]
    if unknown:
        raise KeyFileError(f"unknown SLO classes {unknown}; known: {', '.join(sorted(known))}")


def _printable(text: str, longest: int) -> bool:
    return 0 < len(text) <= longest and text.isprintable() and text.strip() == text


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class Authenticator:
    """Finds the caller of each call (see the module docstring for the three modes)."""

    def __init__(
        self,
        mode: Mode = "open",
        keys: Iterable[KeyEntry] = (),
        path: Path | None = None,
        known_classes: Collection[str] = (),
        reload_s: float = 1.0,
        tenant_header: str = TENANT_HEADER,
    ) -> None:
        self.mode = mode
        self.path = path
        self.known_classes = tuple(known_classes)
        self.reload_s = reload_s
        self.tenant_header = tenant_header
        self._keys = tuple(keys)
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()

    @classmethod
    def open(cls) -> Authenticator:
        return cls("open")

    @classmethod
    def from_settings(
        cls,
        api_keys: Path | None,
        trust_tenant_header: bool,
        known_classes: Collection[str] = (),
        tenant_header: str = TENANT_HEADER,
    ) -> Authenticator:
        """The mode the settings choose; ``KeyFileError`` for a key file that cannot be used."""
        if trust_tenant_header:
            if api_keys is not None:
                raise KeyFileError(
                    "TOKENFLEET_TRUST_TENANT_HEADER takes the tenant from the proxy's "
                    f"{tenant_header} header: do not also set TOKENFLEET_API_KEYS"
                )
            return cls("proxy", tenant_header=tenant_header)
        if api_keys is None:
            return cls.open()
        keys = load_keys(api_keys, known_classes)
        return cls("keys", keys, api_keys, known_classes, tenant_header=tenant_header)

    def describe(self) -> str:
        if self.mode == "keys":
            where = f" of {self.path}" if self.path is not None else ""
            return f"API keys{where} ({len(self._keys)} keys)"
        if self.mode == "proxy":
            return f"the tenant a proxy names in {self.tenant_header} (trusted, not checked)"
        return f"authentication is OFF: every call is tenant {OPEN_TENANT!r} (set TOKENFLEET_API_KEYS)"

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """The caller of a call with these headers; ``ApiError`` 401 if it has none, 403 if its
        tenant header names another tenant than its key's."""
        if self.mode == "open":
            return Caller(OPEN_TENANT)
        named = headers.get(self.tenant_header)
        if self.mode == "proxy":
            if named is None or not _printable(named, MAX_TENANT_LENGTH):
                raise ApiError(
                    401,
                    f"no valid {self.tenant_header} header: this gateway takes the tenant from its "
                    "authenticating proxy",
                    code="missing_tenant",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return Caller(named)
        entry = self._verify(_bearer(headers.get("Authorization")))
        if entry is None:
            raise ApiError(
                401,
                "a valid API key is required: send it as 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if named is not None and named != entry.tenant:
            raise ApiError(
                403,
                f"this API key belongs to tenant {entry.tenant!r}: {self.tenant_header} cannot name another",
                type="permission_denied",
                code="tenant_mismatch",
                param=self.tenant_header,
            )
        return Caller(entry.tenant, entry.slo_classes, entry.name)

    def _verify(self, key: str | None) -> KeyEntry | None:
        if not key:
            return None
        digest = key_hash(key)
        found = None
        for entry in self._current():  # every entry compared, in constant time each
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found

    def _current(self) -> tuple[KeyEntry, ...]:
        now = time.monotonic()
        if self.path is not None and now - self._checked >= self.reload_s:
            self._checked = now
            stamp = self._file_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._keys = tuple(load_keys(self.path, self.known_classes))
                    log.warning("gateway: API keys reloaded from %s (%d keys)", self.path, len(self._keys))
                except KeyFileError as exc:
                    log.error("gateway: %s; keeping the %d keys read before", exc, len(self._keys))
        return self._keys

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            info = self.path.stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip() or None
