"""The configuration file ``callgate.toml`` and ``CALLGATE_*`` variables
(docs/reference/configuration.md).

``Settings`` (``bootstrap.py``) is one frozen model; this module fills it from, in
increasing precedence: its defaults, the configuration file, ``CALLGATE_*`` environment
variables (nested keys with ``__``: ``CALLGATE_APPROVALS__SIGNING_KID``) and command-line
options. The file is ``--config FILE`` / ``CALLGATE_CONFIG``, else ``callgate.toml`` in
the state directory when it exists. Relative paths in the file are relative to the file;
those in variables and options to the working directory.

Every problem raises ``ConfigError`` naming where the bad value came from (the file and
the key, the variable, or the option), so a broken configuration fails at start. Key
files named by the configuration are read here too (``trusted_issuers``,
``approval_keys``), for the same reason. See docs/adr/0013-configuration-and-dev-mode.md.
"""

from __future__ import annotations

import os
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from callgate.domain.limits import parse_document

if TYPE_CHECKING:
    from callgate.domain.claims import Binding, ClaimsMapping
    from callgate.domain.identity import KeySet, TrustedIssuer
    from callgate.domain.keys import KeyRing, PrivateKey, PublicKey

CONFIG_ENV = "CALLGATE_CONFIG"
CONFIG_FILE_NAME = "callgate.toml"
# Variables whose name is not CALLGATE_ + the key (``--timeout`` is ``timeout_s``).
ENV_ALIASES = {"CALLGATE_TIMEOUT": "CALLGATE_TIMEOUT_S"}
ENV_PREFIX = "CALLGATE_"
Algorithm = Literal["EdDSA", "ES256", "RS256"]
REDACTED = "<redacted>"
_SECRET_WORDS = ("password", "secret", "token", "credential", "key.pem", "private", "headers")

S = TypeVar("S", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key (or variable)."""


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


# --- loading ----------------------------------------------------------------------------------


def config_file_for(
    state_dir: Path | None, environ: Mapping[str, str], explicit: Path | None
) -> Path | None:
    """``--config``, else ``CALLGATE_CONFIG``, else ``<state dir>/callgate.toml`` if present."""
    if explicit is not None:
        return explicit
    if value := environ.get(CONFIG_ENV):
        return Path(value)
    state = state_dir or Path(environ.get(f"{ENV_PREFIX}STATE_DIR") or ".callgate")
    candidate = state / CONFIG_FILE_NAME
    return candidate if candidate.is_file() else None


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(err: Mapping[str, Any]) -> str:
    return "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"])


def _depth(raw: Mapping[str, Any], loc: tuple[int | str, ...]) -> int:
    """How many leading parts of ``loc`` (a validation error's location) ``raw`` holds."""
    node: Any = raw
    for depth, part in enumerate(loc):
        in_mapping = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list | tuple) and isinstance(part, int) and part < len(node)
        if not (in_mapping or in_list):
            return depth
        node = node[part]
    return len(loc)


def _variable(loc: tuple[int | str, ...]) -> str:
    names = []
    for part in loc:
        if isinstance(part, int):
            break
        names.append(str(part))
    return ENV_PREFIX + "__".join(names).upper()


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _rebased(value: Any, base: Path) -> Any:
    """``value`` (a dump of the file's settings) with relative paths made relative to ``base``."""
    if isinstance(value, Path):
        return value if value.is_absolute() else base / value
    if isinstance(value, Mapping):
        return {k: _rebased(v, base) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rebased(v, base) for v in value]
    return value


def _environment(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``CALLGATE_*`` variables that name a key of ``model``, as nested values.

    Names are case-insensitive, nested keys are joined by ``__``, lists and tables are
    JSON, empty variables are not set; other ``CALLGATE_*`` variables are not keys
    (``CALLGATE_CONFIG``). Values stay text for the model to validate, so an error names
    the variable (``load_settings``).
    """
    values = {
        k.upper(): v for k, v in environ.items() if v != "" and k.upper().startswith(ENV_PREFIX)
    }
    for old, new in ENV_ALIASES.items():  # names older than the file
        if old in values:
            values.setdefault(new, values.pop(old))
    return _keys(model, ENV_PREFIX, values)


def _keys(model: type[BaseModel], prefix: str, values: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        if variable in values:
            out[name] = _decoded(variable, values[variable], field.annotation)
        section = _section(field.annotation)
        nested = _keys(section, variable + "__", values) if section is not None else {}
        if nested:
            whole = out.get(name)
            out[name] = _merge(whole, nested) if isinstance(whole, dict) else nested
    return out


def _decoded(variable: str, text: str, annotation: Any) -> Any:
    if not _structured(annotation):
        return text
    try:
        return parse_document(text)  # the one strict reader: no duplicate keys, no NaN
    except ValueError as exc:
        raise ConfigError(f"environment {variable}: not valid JSON: {exc}") from None


def _section(annotation: Any) -> type[BaseModel] | None:
    is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_section else None


def _structured(annotation: Any) -> bool:
    """A list, a table or a section: given as JSON in a variable. (pydantic keeps a field's
    ``Annotated`` metadata apart from its annotation, so none arrives here.)"""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_structured(a) for a in get_args(annotation) if a is not type(None))
    target = origin or annotation
    return isinstance(target, type) and issubclass(
        target, dict | list | tuple | set | frozenset | BaseModel
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"configuration {path}: cannot read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration {path}: invalid TOML: {exc}") from None


def load_settings(
    cls: type[S],
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> S:
    """Defaults < configuration file < ``CALLGATE_*`` < ``overrides`` (options), validated."""
    environ = os.environ if environ is None else environ
    given = {k: v for k, v in overrides.items() if v is not None}
    path = config_file_for(given.get("state_dir"), environ, config_file)
    file_values: dict[str, Any] = {}
    if path is not None:
        path = path.absolute()
        raw = _read_toml(path)
        try:
            parsed = cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(
                f"configuration {path}: key '{_key_path(first['loc'])}': {_message(first)}"
            ) from None
        file_values = _rebased(parsed.model_dump(exclude_unset=True), path.parent)
        file_values["config_file"] = path
    env_values = _environment(cls, environ)
    env_values.pop("config_file", None)  # set from CALLGATE_CONFIG / --config only
    merged = _merge(_merge(file_values, env_values), given)
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        key = f"key '{_key_path(loc)}'"
        option, variable, in_file = (
            _depth(given, loc),
            _depth(env_values, loc),
            _depth(file_values, loc),
        )
        if option and option >= max(variable, in_file):
            where = f"option --{str(loc[0]).replace('_', '-')}"
        elif variable and variable >= in_file:
            where = f"environment {_variable(loc)}: {key}"
        elif path is not None:
            where = f"configuration {path}: {key}"
        else:
            where = f"settings: {key}"
        raise ConfigError(f"{where}: {_message(first)}") from None


# --- key material named by the configuration -----------------------------------------------


def _where(settings: Any, key: str) -> str:
    source = settings.config_file
    return f"configuration {source}: key '{key}'" if source else f"setting '{key}'"


def _public_keys(
    settings: Any, key: str, jwks_file: Path | None, pem_files: Mapping[str, Path]
) -> dict[str, PublicKey]:
    from callgate.adapters.keyfiles import KeyFileError, load_jwks, load_public_key

    keys: dict[str, PublicKey] = {}
    try:
        if jwks_file is not None:
            keys.update(load_jwks(jwks_file))
        for kid, pem in pem_files.items():
            if kid in keys:
                raise KeyFileError(f"kid {kid!r} is in the JWKS file and in pem_files")
            keys[kid] = load_public_key(pem)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, key)}: {exc}") from None
    return keys


# An issuer's keys that rotate (``jwks_uri`` or its discovery document's), already
# fetched once; an adapter (``callgate.adapters.jwks``) given by the composition root.
# Raises ``OSError`` or ``ValueError`` naming what failed.
KeySets = Callable[[IssuerSettings], "KeySet"]


def trusted_issuers(settings: Any, key_sets: KeySets | None = None) -> list[TrustedIssuer]:
    """The configured session issuers (C6) with their keys (from their key files, or from
    ``key_sets`` for keys fetched over HTTP), claims mappings and bindings (ADR 0078)."""
    from callgate.domain.claims import Binding
    from callgate.domain.identity import TrustedIssuer
    from callgate.domain.keys import algorithm_of
    from callgate.domain.scope import OPERATOR_ROLE

    out: list[TrustedIssuer] = []
    owner: dict[str, str] = {}
    several = len(settings.sessions.issuers) > 1
    for i, entry in enumerate(settings.sessions.issuers):
        key = f"sessions.issuers[{i}]"
        if several and entry.tenants is None and entry.tenant is None:
            raise ConfigError(
                f"{_where(settings, key + '.tenants')}: missing: with more than one issuer,"
                " each names the tenants it may assert (tenants, or one tenant)"
            )
        keys = _public_keys(settings, key, entry.jwks_file, entry.pem_files)
        key_set: KeySet | None = None
        if entry.rotating_keys:
            if key_sets is None:
                raise ConfigError(f"{_where(settings, key)}: its keys need fetching")
            try:
                key_set = key_sets(entry)
            except (OSError, ValueError) as exc:
                where = _where(settings, key + ".algorithms" if "allowed" in str(exc) else key)
                raise ConfigError(f"{where}: keys: {exc}") from None
            keys = dict(key_set.current())
        if not keys:
            raise ConfigError(
                f"{_where(settings, key)}: names no key (jwks_file, pem_files, jwks_uri or"
                " discovery = true)"
            )
        for kid, public in keys.items():
            if algorithm_of(public) not in entry.algorithms:
                allowed = ", ".join(entry.algorithms)
                raise ConfigError(
                    f"{_where(settings, key + '.algorithms')}: key {kid!r} is "
                    f"{algorithm_of(public)}, not among the allowed ({allowed})"
                )
            if kid in owner:
                raise ConfigError(
                    f"{_where(settings, key)}: kid {kid!r} also belongs to issuer {owner[kid]!r}"
                )
            owner[kid] = entry.issuer
        out.append(
            TrustedIssuer(
                entry.issuer,
                entry.audience,
                {} if key_set is not None else keys,
                entry.algorithms,
                entry.clock_skew_s * 1000,
                claims=entry.claims_mapping(),
                binding=entry.binding(),
                key_set=key_set,
            )
        )
    slack = slack_issuer(settings)
    if slack is not None:
        kid, private = slack
        if kid in owner:
            raise ConfigError(
                f"{_where(settings, 'slack.session_kid')}: kid {kid!r} also belongs to"
                f" issuer {owner[kid]!r}"
            )
        alg = algorithm_of(private.public_key())
        # Slack sessions are minted by callgate for the mapped users: bound to exactly
        # their tenants and roles.
        users = settings.slack.users
        roles = frozenset(r for u in users for r in u.roles)
        binding = Binding(frozenset(u.tenant for u in users), roles, OPERATOR_ROLE in roles)
        out.append(
            TrustedIssuer(
                SLACK_ISSUER, "callgate", {kid: private.public_key()}, (alg,), binding=binding
            )
        )
    return out


SLACK_ISSUER = "callgate-slack"


def slack_issuer(settings: Any) -> tuple[str, PrivateKey] | None:
    """The kid and private key that sign mapped Slack users' session tokens, if Slack is
    configured (``[slack]``)."""
    from callgate.adapters.keyfiles import KeyFileError, load_private_key

    conf: SlackSettings = settings.slack
    if not conf.configured:
        return None
    assert conf.session_kid is not None and conf.session_key_file is not None
    try:
        return conf.session_kid, load_private_key(conf.session_key_file)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, 'slack.session_key_file')}: {exc}") from None


@dataclass(frozen=True)
class ApprovalKeys:
    """The active signing key and every verifying key, by kid."""

    signing_kid: str
    signing_key: PrivateKey
    verification_keys: Mapping[str, PublicKey]


def approval_keys(settings: Any, state_keys: KeyRing) -> ApprovalKeys:
    """From ``approvals`` when configured (shared by every instance), else the state
    directory's key (one instance only)."""
    conf: ApprovalSettings = settings.approvals
    if not conf.configured:
        return ApprovalKeys(
            state_keys.approval_kid,
            state_keys.approval_signing_key,
            state_keys.approval_verification_keys(),
        )
    from callgate.adapters.keyfiles import KeyFileError, load_private_key

    if not conf.signing_kid or conf.signing_key_file is None:
        missing = "approvals.signing_kid" if not conf.signing_kid else "approvals.signing_key_file"
        raise ConfigError(f"{_where(settings, missing)}: missing (the active signing key)")
    try:
        private = load_private_key(conf.signing_key_file)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, 'approvals.signing_key_file')}: {exc}") from None
    verifying = _public_keys(settings, "approvals", conf.jwks_file, conf.pem_files)
    public = private.public_key()
    listed = verifying.get(conf.signing_kid)
    if listed is not None and _raw(listed) != _raw(public):
        raise ConfigError(
            f"{_where(settings, 'approvals.signing_kid')}: {conf.signing_kid!r} names another"
            " public key in the verification keys than the signing key file holds"
        )
    verifying[conf.signing_kid] = public
    return ApprovalKeys(conf.signing_kid, private, verifying)


def _raw(key: PublicKey) -> bytes:
    from callgate.adapters.keyfiles import public_pem

    return public_pem(key)


# --- `callgate config check` ------------------------------------------------------------------


def redacted(value: Any) -> Any:
    """``value`` (a JSON dump) with the value of every key that names a secret replaced."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED
            if any(w in str(k).lower() for w in _SECRET_WORDS) and v not in (None, "", {})
            else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value
