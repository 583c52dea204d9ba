"""Where a session token's identity is, and what its issuer may assert (C6, ADR 0078).

Identity providers put the user, the tenant and the roles in different claims (Entra ID's
``tid`` and ``roles``, Okta's ``groups``, Keycloak's ``realm_access.roles``, Auth0's
namespaced claims). ``ClaimsMapping`` says, per issuer, where each one is; ``Binding``
says what that issuer may assert. Pure: ``identity.SessionVerifier`` applies both after
the signature and time checks.

A claim path is a tuple of names. One name is one claim, taken whole, dots, slashes and
all (``("https://example.com/tenant",)``, ``("realm_access.roles",)`` is a claim whose
name has a dot); a longer tuple walks nested JSON objects (``("realm_access", "roles")``).
Nothing splits a name on dots, so no name can be read as a path or a path as a name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from callgate.domain.scope import OPERATOR_ROLE  # only an issuer marked ``operators`` grants it

ClaimPath = tuple[str, ...]

# The agent (the client acting for the user): the first of these claims the token carries.
# ``azp`` (OpenID Connect) wins over ``client_id`` (RFC 9068).
AGENT_CLAIMS: Final = ("azp", "client_id")


class _Missing:
    """A claim the token does not carry (``read``)."""


MISSING: Final = _Missing()


def path_text(path: ClaimPath) -> str:
    """A path as messages name it: its names joined by dots (``realm_access.roles``)."""
    return ".".join(path)


def read(claims: Mapping[str, Any], path: ClaimPath) -> Any:
    """The value at ``path``, or ``MISSING`` when a name is absent or a step is not an
    object (a path never reaches into a list or a string)."""
    node: Any = claims
    for name in path:
        if not isinstance(node, Mapping) or name not in node:
            return MISSING
        node = node[name]
    return node


@dataclass(frozen=True)
class ClaimsMapping:
    """Where one issuer's tokens carry the user, the tenant and the roles.

    ``tenant_constant``: the tenant of every token (an issuer that serves one tenant);
    then ``tenant`` is not read. ``role_map``: the provider's values (groups, app roles,
    permissions) mapped to callgate roles; a value it does not list grants nothing.
    Without it the values are the roles. ``roles_required``: an absent roles claim is
    refused (the default shape) rather than read as no roles (providers omit an empty
    ``groups`` or ``roles``). ``agent``: the claims naming the agent, the first present
    one read (top-level names).
    """

    subject: ClaimPath = ("sub",)
    tenant: ClaimPath = ("tenant",)
    roles: ClaimPath = ("roles",)
    tenant_constant: str | None = None
    role_map: Mapping[str, tuple[str, ...]] | None = None
    roles_required: bool = True
    agent: tuple[str, ...] = AGENT_CLAIMS

    def __post_init__(self) -> None:
        for path in (self.subject, self.tenant, self.roles):
            if not path or not all(path):
                raise ValueError("a claim path is one or more non-empty names")
        if not self.agent or not all(self.agent):
            raise ValueError("the agent claims are one or more non-empty names")
        if self.role_map is not None:
            object.__setattr__(self, "role_map", MappingProxyType(dict(self.role_map)))

    def mapped_roles(self, values: list[str]) -> tuple[str, ...]:
        """The callgate roles ``values`` (the provider's, already checked) grant, each once."""
        if self.role_map is None:
            return tuple(dict.fromkeys(values))
        return tuple(dict.fromkeys(r for v in values for r in self.role_map.get(v, ())))


@dataclass(frozen=True)
class Binding:
    """What one issuer may assert. ``tenants``/``roles`` ``None``: any (one issuer alone, the
    development issuer); the operator role only with ``operators``. Exact comparison."""

    tenants: frozenset[str] | None = None
    roles: frozenset[str] | None = None
    operators: bool = False

    def refusal(self, tenant: str, roles: tuple[str, ...]) -> tuple[str, str] | None:
        """``(rule, reason)`` when ``tenant`` or ``roles`` exceed the binding, else None."""
        if self.tenants is not None and tenant not in self.tenants:
            return "tenants", f"the issuer may not assert tenant {tenant!r}"
        for role in roles:
            if role == OPERATOR_ROLE and not self.operators:
                return "operators", f"the issuer may not grant {OPERATOR_ROLE!r}"
            if role != OPERATOR_ROLE and self.roles is not None and role not in self.roles:
                return "roles", f"the issuer may not grant role {role!r}"
        return None


UNBOUND = Binding(operators=True)  # the development issuer: it asserts anything asked


@dataclass(frozen=True)
class Preset:
    """The claims one kind of identity provider issues (``preset = "..."``); explicit keys
    of ``[[sessions.issuers]]`` override each part."""

    subject: ClaimPath
    tenant: ClaimPath | None  # None: the issuer must name a tenant or a tenant claim
    roles: ClaimPath
    agent: tuple[str, ...] = AGENT_CLAIMS


PRESETS: Final[Mapping[str, Preset]] = MappingProxyType(
    {
        # Microsoft Entra ID: ``oid`` is the user's id in the directory (``sub`` differs
        # per application), ``tid`` the directory, ``roles`` the app roles assigned.
        "entra": Preset(("oid",), ("tid",), ("roles",)),
        # Okta: ``sub`` is the login; groups from a ``groups`` claim on the authorization
        # server; one Okta org serves one tenant, so the tenant is configured. Its access
        # tokens name the client in ``cid`` (no ``azp``, no ``client_id``).
        "okta": Preset(("sub",), None, ("groups",), ("cid", *AGENT_CLAIMS)),
        # Auth0: the organization (``org_id``) is the tenant; ``permissions`` are the
        # API's RBAC permissions ("Add Permissions in the Access Token").
        "auth0": Preset(("sub",), ("org_id",), ("permissions",)),
        # Keycloak: realm roles under ``realm_access``; a realm is usually one tenant.
        "keycloak": Preset(("sub",), None, ("realm_access", "roles")),
    }
)
