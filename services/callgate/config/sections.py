"""The sections of the settings (``[issuers]``, ``[approvals]``, ``[notify]``, ...): each a
frozen model that refuses unknown keys, so a misspelt key fails at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from callgate.domain.claims import Binding, ClaimsMapping

Algorithm = Literal["EdDSA", "ES256", "RS256"]


class _Section(BaseModel):
    # No NaN or infinity (TOML has ``nan`` and ``inf``; a variable may say ``inf``): refused
    # as the strict JSON reader refuses them (docs/contract.md, "Parse strictly").
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# A claim: one name, taken whole (dots and all), or a list of names walking nested objects.
ClaimSetting = str | list[str]
Preset = Literal["entra", "okta", "auth0", "keycloak"]


class IssuerSettings(_Section):
    """An identity provider whose session tokens are trusted (C6): its keys, where its
    tokens carry the identity (claims mapping) and what it may assert (binding, ADR 0078)."""

    issuer: str = Field(min_length=1, description="the exact `iss` claim of its tokens")
    audience: str = Field(default="callgate", min_length=1, description="required in `aud`")
    jwks_file: Path | None = Field(default=None, description="its public keys (JWKS)")
    pem_files: dict[str, Path] = Field(
        default_factory=dict, description="kid -> PEM public key file"
    )
    # Keys that rotate: fetched from this URL (or the discovery document's jwks_uri with
    # ``discovery = true``) at start, again every ``jwks_refresh_s`` and for an unknown kid
    # (at most once per ``jwks_min_refresh_s``); kept through failed fetches for at most
    # ``jwks_max_stale_s`` after the last good one.
    jwks_uri: str | None = Field(default=None, pattern=r"^https?://")
    discovery: bool = False
    jwks_refresh_s: float = Field(default=900.0, ge=1.0, le=86_400.0)
    jwks_min_refresh_s: float = Field(default=30.0, ge=0.0, le=3_600.0)
    jwks_max_stale_s: float = Field(default=21_600.0, ge=1.0, le=604_800.0)
    algorithms: tuple[Algorithm, ...] = Field(default=("EdDSA",), min_length=1)
    clock_skew_s: int = Field(default=30, ge=0, le=600, description="leeway on exp/nbf/iat")
    # Claims mapping: where the user, tenant and roles are (a preset, then explicit keys).
    preset: Preset | None = None
    subject_claim: ClaimSetting | None = None
    tenant_claim: ClaimSetting | None = None
    tenant: str | None = Field(default=None, description="the one tenant of every token")
    roles_claim: ClaimSetting | None = None
    role_map: dict[str, str | list[str]] | None = Field(
        default=None, description="provider value -> callgate role(s); others grant nothing"
    )
    # Binding: the tenants it may assert, the roles it may grant (unset: any role but the
    # operator role), and whether it may grant the operator role.
    tenants: tuple[str, ...] | None = Field(default=None, min_length=1)
    roles: tuple[str, ...] | None = None
    operators: bool = False
    # Console sign-in with this provider (OpenID Connect, authorization code + PKCE; ADR
    # 0031). With a client_id, keys named by neither jwks_file nor pem_files come from
    # the discovery document's jwks_uri, and the audience defaults to the client_id.
    client_id: str | None = Field(default=None, min_length=1, description="console's client")
    client_secret: str | None = Field(default=None, min_length=1, description="confidential")
    redirect_uri: str | None = Field(
        default=None, pattern=r"^https?://", description="<console URL>/v1/oidc/callback"
    )
    scopes: tuple[str, ...] = Field(default=("openid",), min_length=1)
    name: str | None = Field(default=None, min_length=1, description="the sign-in button's")

    @model_validator(mode="after")
    def _identity(self) -> IssuerSettings:
        """Mapping and binding that can be used, refused at start otherwise."""
        from callgate.domain.claims import PRESETS
        from callgate.domain.principal import canonical_problem
        from callgate.domain.scope import OPERATOR_ROLE

        for claim in (self.subject_claim, self.tenant_claim, self.roles_claim):
            names = [claim] if isinstance(claim, str) else claim or []
            if claim is not None and (not names or not all(names)):
                raise ValueError("a claim is a non-empty name or a list of non-empty names")
        if self.tenant is not None and self.tenant_claim is not None:
            raise ValueError("tenant (one tenant) and tenant_claim exclude each other")
        preset = PRESETS[self.preset] if self.preset else None
        if preset and preset.tenant is None and self.tenant_claim is None and self.tenant is None:
            raise ValueError(f"preset {self.preset!r} needs tenant or tenant_claim")
        mapped = [
            r for v in (self.role_map or {}).values() for r in ([v] if isinstance(v, str) else v)
        ]
        given = [
            *([self.tenant] if self.tenant is not None else []),
            *(self.tenants or ()),
            *(self.roles or ()),
            *(self.role_map or {}),
            *mapped,
        ]
        for value in given:
            if (problem := canonical_problem(value)) is not None:
                raise ValueError(f"{value!r} {problem} (identifiers compare exactly)")
        if self.tenant is not None and self.tenants is not None and self.tenant not in self.tenants:
            raise ValueError(f"tenant {self.tenant!r} is not among its tenants")
        if self.roles is not None:
            outside = [r for r in mapped if r not in self.roles and r != OPERATOR_ROLE]
            if outside:
                raise ValueError(f"role_map grants {outside[0]!r}, not among its roles")
        if not self.operators and OPERATOR_ROLE in (*mapped, *(self.roles or ())):
            raise ValueError(f"{OPERATOR_ROLE!r} needs operators = true")
        if self.jwks_uri is not None and (self.jwks_file is not None or self.pem_files):
            raise ValueError("jwks_uri and key files (jwks_file, pem_files) exclude each other")
        if self.discovery and (self.jwks_uri or self.jwks_file is not None or self.pem_files):
            raise ValueError("discovery = true and named keys exclude each other")
        return self

    @model_validator(mode="after")
    def _sign_in(self) -> IssuerSettings:
        if self.client_id is None:
            if self.client_secret or self.redirect_uri:
                raise ValueError("client_secret and redirect_uri need a client_id")
            return self
        if self.redirect_uri is None:
            raise ValueError("a client_id (console sign-in) needs its redirect_uri")
        if "openid" not in self.scopes:
            raise ValueError("scopes must include 'openid'")
        if "audience" not in self.model_fields_set:
            object.__setattr__(self, "audience", self.client_id)
        return self

    @property
    def discovered_keys(self) -> bool:
        """Keys from the provider's discovery document (no key file or URL is named)."""
        named = self.jwks_file is not None or bool(self.pem_files) or self.jwks_uri is not None
        return (self.discovery or self.client_id is not None) and not named

    @property
    def rotating_keys(self) -> bool:
        """Keys fetched over HTTP while callgate runs (``jwks_uri`` or discovery)."""
        return self.jwks_uri is not None or self.discovered_keys

    def claims_mapping(self) -> ClaimsMapping:
        """Where its tokens carry the identity: the preset's claims, then explicit keys."""
        from callgate.domain.claims import AGENT_CLAIMS, PRESETS, ClaimsMapping

        preset = PRESETS[self.preset] if self.preset else None
        subject = _claim_path(self.subject_claim) or (preset.subject if preset else ("sub",))
        tenant = _claim_path(self.tenant_claim) or (
            preset.tenant if preset and preset.tenant else ("tenant",)
        )
        roles = _claim_path(self.roles_claim) or (preset.roles if preset else ("roles",))
        role_map = None
        if self.role_map is not None:
            role_map = {
                k: (v,) if isinstance(v, str) else tuple(v) for k, v in self.role_map.items()
            }
        # The default shape (no preset, no roles_claim) keeps requiring its ``roles``.
        required = preset is None and self.roles_claim is None
        return ClaimsMapping(
            subject,
            tenant,
            roles,
            self.tenant,
            role_map,
            required,
            preset.agent if preset else AGENT_CLAIMS,
        )

    def binding(self) -> Binding:
        """What its tokens may assert (a constant tenant binds to that tenant)."""
        from callgate.domain.claims import Binding

        tenants = self.tenants or ((self.tenant,) if self.tenant is not None else None)
        return Binding(
            frozenset(tenants) if tenants is not None else None,
            frozenset(self.roles) if self.roles is not None else None,
            self.operators,
        )


def _claim_path(claim: ClaimSetting | None) -> tuple[str, ...] | None:
    """A claim name as one name (never split on dots), a list as a path."""
    if claim is None:
        return None
    return (claim,) if isinstance(claim, str) else tuple(claim)


class SessionSettings(_Section):
    issuers: tuple[IssuerSettings, ...] = ()


class ApprovalSettings(_Section):
    """The approval-signing keys (C11). One active signing key; any number of keys that
    verify (the active one always does), so a rotated-out key keeps verifying the
    artifacts it signed until they expire. Unset: a key of the state directory."""

    signing_kid: str | None = Field(default=None, min_length=1)
    signing_key_file: Path | None = Field(default=None, description="PEM private key")
    jwks_file: Path | None = Field(default=None, description="verification keys (JWKS)")
    pem_files: dict[str, Path] = Field(
        default_factory=dict, description="kid -> PEM public key file"
    )

    @property
    def configured(self) -> bool:
        return bool(self.signing_kid or self.signing_key_file or self.jwks_file or self.pem_files)


class WebhookSettings(_Section):
    """One receiver of approval notices, signed per Standard Webhooks (ADR 0032)."""

    url: str = Field(pattern=r"^https?://", description="where notices are POSTed")
    secret: str = Field(min_length=1, description="the endpoint's whsec_… signing secret")
    # ``access_request.decided``: ARAP callbacks a PEP asks for with this URL (ADR 0090).
    events: tuple[
        Literal["approval.pending", "approval.decided", "access_request.decided"], ...
    ] = (
        "approval.pending",
        "approval.decided",
    )
    # The tenants whose items it receives (exact names); empty: every tenant's.
    tenants: tuple[str, ...] = ()


class NotifySettings(_Section):
    """Telling approvers that something waits for them (``callgate serve --http``)."""

    webhooks: tuple[WebhookSettings, ...] = ()
    # The console's public URL: notices link to ``<console_url>/#invocation=<id>``.
    console_url: str | None = Field(default=None, pattern=r"^https?://")
    # Seconds before each retry of a failed delivery; after the last, a dead letter.
    retry_delays_s: tuple[float, ...] = Field(default=(1.0, 5.0, 30.0, 120.0, 600.0))
    timeout_s: float = Field(default=5.0, gt=0, le=60)
    # JSON lines of the deliveries given up on; relative to the state directory.
    dead_letter_file: Path = Path("notify-dead-letters.jsonl")
    # The notifier's stored position (the items it has told as pending), so that after a
    # restart it tells what was decided meanwhile; relative to the state directory.
    position_file: Path = Path("notify-position.json")
    # The ARAP callbacks still to send (ADR 0090); relative to the state directory.
    callbacks_file: Path = Path("arap-callbacks.json")


class SlackUser(_Section):
    """A Slack user and the callgate identity their clicks act as (exact ids)."""

    slack_user: str = Field(min_length=1, description="the Slack user id, e.g. U0123ABCD")
    user: str = Field(min_length=1)
    tenant: str = Field(min_length=1)
    roles: tuple[str, ...] = ()


class SlackSettings(_Section):
    """Approvals in Slack: a Block Kit message per pending item, Approve/Deny buttons
    whose clicks callgate verifies and decides on (ADR 0032)."""

    api_url: str = Field(default="https://slack.com/api/", pattern=r"^https?://")
    bot_token: str | None = Field(default=None, min_length=1, description="xoxb-…")
    signing_secret: str | None = Field(default=None, min_length=1)
    channel: str | None = Field(default=None, min_length=1, description="default channel")
    tenant_channels: dict[str, str] = Field(default_factory=dict, description="tenant -> ch")
    team_id: str | None = Field(default=None, min_length=1, description="required team")
    users: tuple[SlackUser, ...] = ()
    # The key that signs the short-lived session tokens of mapped Slack users (issuer
    # ``callgate-slack``, trusted exactly when configured here).
    session_kid: str | None = Field(default=None, min_length=1)
    session_key_file: Path | None = Field(default=None, description="PEM private key")
    # Whether this instance posts the messages. Slack does not deduplicate: with several
    # instances, one posts (true) and the others only take clicks (false).
    post_messages: bool = True

    @model_validator(mode="after")
    def _complete(self) -> SlackSettings:
        given = [self.bot_token, self.signing_secret, self.session_kid, self.session_key_file]
        if any(v is not None for v in given) and not all(v is not None for v in given):
            raise ValueError(
                "bot_token, signing_secret, session_kid and session_key_file go together"
            )
        if self.bot_token is not None and self.channel is None and not self.tenant_channels:
            raise ValueError("a channel (or tenant_channels) is needed")
        seen: set[str] = set()
        for u in self.users:
            if u.slack_user in seen:
                raise ValueError(f"Slack user {u.slack_user!r} is mapped twice")
            seen.add(u.slack_user)
        return self

    @property
    def configured(self) -> bool:
        return self.bot_token is not None


class TracingSettings(_Section):
    """OpenTelemetry traces (``[tracing]``, ADR 0036): off unless ``enabled``; when off no
    SDK tracer provider exists and nothing is recorded."""

    enabled: bool = False
    exporter: Literal["otlp_grpc", "otlp_http"] = "otlp_grpc"
    # OTLP gRPC: ``http://host:4317``; OTLP HTTP: ``http://host:4318/v1/traces``.
    endpoint: str = Field(default="http://127.0.0.1:4317", pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict, description="sent with each export")
    # The share of new traces recorded; a caller's sampled trace is always continued.
    sampling_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    service_name: str = Field(default="callgate", min_length=1)
    timeout_s: float = Field(default=10.0, gt=0, le=60)


class PinningSettings(_Section):
    """Pinned upstream tools (``[pinning]``, ADR 0066): how often ``serve`` and ``callgate
    mcp`` list the upstreams' tools to compare them with their pins (also at start)."""

    check_interval_s: float = Field(default=60.0, ge=1.0, le=86_400.0)
