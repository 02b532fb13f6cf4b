"""Who a request belongs to, for `fair` scheduling (`core/fair_share.py`).

In order: the tenant of the API key it came with (`--api-keys-file`: `KEY TENANT [WEIGHT]` a
line, `#` comments; a tenant's weight is its share, 1 if unsaid); else, where the operator
trusts clients to say (`--tenant-header`), its `x-tenant` header; else (`--tenant-from-user`)
the body's `user` field; else the default tenant. A header or field that is not trusted is
ignored, never an error. Tenant names are short printable text; a longer or stranger one is a
400 naming where it came from.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from pathlib import Path

from inflight.config import is_tenant_weight
from inflight.errors import InvalidRequestError
from inflight.request import DEFAULT_TENANT

MAX_TENANT_CHARS = 64
TENANT_HEADER = "x-tenant"

# set by the guard for the handler: the rules, and the tenant the key (or header) named
_rules: contextvars.ContextVar[Tenancy | None] = contextvars.ContextVar("tenancy", default=None)
_named: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


@dataclass(frozen=True)
class Tenancy:
    """The operator's rules: keys and their tenants, and whether clients may name one."""

    keys: dict[str, str] = field(default_factory=dict)  # API key -> tenant
    weights: dict[str, float] = field(default_factory=dict)  # tenant -> weight
    trust_header: bool = False
    from_user: bool = False

    def on_request(self, key: str | None, header: str | None) -> None:
        """Called by the guard once the key is accepted: what the request says of its tenant."""
        tenant = self.keys.get(key) if key is not None else None
        if tenant is None and self.trust_header and header is not None:
            tenant = checked_tenant(header, TENANT_HEADER)
        _rules.set(self)
        _named.set(tenant)


def request_tenant(user: str | None) -> str:
    """The tenant of the request being handled (`user`: its body's `user` field), by the
    rules its guard saw; the default tenant outside a guarded request."""
    rules, named = _rules.get(), _named.get()
    if named is not None:
        return named
    if rules is not None and rules.from_user and user:
        return checked_tenant(user, "user")
    return DEFAULT_TENANT


def checked_tenant(name: str, param: str) -> str:
    if not (0 < len(name) <= MAX_TENANT_CHARS and name.isprintable()):
        raise InvalidRequestError(
            f"a tenant name must be 1 to {MAX_TENANT_CHARS} printable characters", param
        )
    return name


def read_api_keys(path: str | Path) -> tuple[dict[str, str], dict[str, float]]:
    """(key -> tenant, tenant -> weight) from a keys file; ValueError naming the line of a key
    given twice, a weight that is not a positive finite number, a line that does not read, or
    one tenant given two weights."""
    keys: dict[str, str] = {}
    weights: dict[str, float] = {}
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        if len(words) not in (2, 3):
            raise ValueError(f"{where}: expected KEY TENANT [WEIGHT], got {len(words)} words")
        key, tenant = words[0], checked_name(words[1], where)
        try:
            weight = float(words[2]) if len(words) == 3 else 1.0
        except ValueError:
            raise ValueError(f"{where}: weight {words[2]!r} is not a number") from None
        if not is_tenant_weight(weight):
            raise ValueError(f"{where}: weight must be a positive finite number, got {weight}")
        if key in keys:
            raise ValueError(f"{where}: this key was given before")
        if weights.get(tenant, weight) != weight:
            raise ValueError(f"{where}: tenant {tenant!r} was given weight {weights[tenant]} "
                             "before")  # fmt: skip
        keys[key], weights[tenant] = tenant, weight
    if not keys:
        raise ValueError(f"{path}: no keys")
    return keys, weights


def checked_name(name: str, where: str) -> str:
    try:
        return checked_tenant(name, "tenant")
    except InvalidRequestError as e:
        raise ValueError(f"{where}: {e.message}") from None
