"""The tool catalog, loaded from a YAML adoption profile (C10).

Mutation flags, impact, dry-run support and the confirmation policy of every tool
live here, never in prompt text. Missing safety flags default to the strict side
(fail closed): a tool that does not say otherwise is a high-impact mutation that
needs a dry-run and an approver. The profile digest is the *policy version*
recorded on every decision and bound into approvals (C4, C11).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from fnmatch import translate
from functools import cached_property
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema_rs
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StringConstraints,
    ValidationError,
)

from callgate.domain.canonical import canonical_json, sha256_hex
from callgate.domain.usage import UsageLimit, parse_limits, schema_problem

# Names end up inside generated Cedar policy text: keep them to a quote-free alphabet.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$", max_length=128)]
Glob = Annotated[str, StringConstraints(min_length=1)]
# A tool name on an upstream MCP server (the MCP tool-name alphabet; never placed in Cedar).
UpstreamName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-/]{1,128}$")]
# The digest of an upstream tool's definition (``domain.pins.definition_digest``).
PinDigest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
UpstreamMethod = Literal["tools/call", "resources/read", "prompts/get"]

# Provider kinds a profile may declare under ``providers:``; a provider a tool names but the
# profile does not declare is one of the bundled simulations.


class ProfileError(Exception):
    """A profile that cannot be used; the message names the file, the tool and the field."""


class Confirmation(StrEnum):
    NONE = "none"
    OWNER = "owner"
    APPROVER = "approver"


class Impact(StrEnum):
    LOW = "low"
    HIGH = "high"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Threshold(_Frozen):
    """High impact when the numeric argument ``arg`` is >= ``gte`` (C4)."""

    arg: Name
    gte: StrictFloat


class QuorumWhen(_Frozen):
    """The quorum applies when argument ``arg`` is one of ``values`` (ADR 0030)."""

    arg: Name
    values: tuple[str, ...] = Field(min_length=1)


class EntryLimits(_Frozen):
    """What every entry refuses before parsing further (docs/contract.md, "Limits at every
    entry"); ``entry_limits:`` of the profile."""

    max_args_bytes: int = Field(default=16384, gt=0)
    max_depth: int = Field(default=8, ge=1)


class ToolSpec(_Frozen):
    """One catalog entry (C10). Safety flags default to the strict side (fail closed).

    ``args_schema`` is a JSON Schema (Draft 2020-12); treat it as read-only.
    """

    name: Name
    description: str = ""
    mutation: bool = True
    impact: Impact = Impact.HIGH
    high_impact_when: Threshold | None = None
    require_dry_run: bool = True
    confirmation: Confirmation = Confirmation.APPROVER
    provider: Name
    target_arg: Name | None  # required key; null means the call creates a new resource
    identity_args: tuple[Name, ...] = ()
    callers: tuple[Name, ...] = ()
    approvers: tuple[Name, ...] = ()
    approval_ttl_seconds: int = Field(default=900, gt=0)
    allow_self_approval: bool = False
    # ADR 0029: a granted approval runs the approved call at once (the invocation that
    # asked continues); off, the agent resubmits with the approval_id.
    continue_on_approval: bool = True
    # ADR 0030: distinct holders of ``approvers`` roles who must grant (quorum).
    approvals_required: int = Field(default=1, ge=1, le=10)
    # Only calls whose argument matches need the quorum; unset: every call of the entry.
    approvals_required_when: QuorumWhen | None = None
    args_schema: dict[str, Any]
    # Tools of an ``mcp`` provider (docs/adr/0019-mcp-gateway.md): the upstream's tool that
    # applies the effect (default: the name without its ``<provider>.`` prefix), its
    # read-only preview (needed when ``require_dry_run``) and its reconciliation lookup (C12).
    upstream_tool: UpstreamName | None = None
    dry_run_tool: UpstreamName | None = None
    lookup_tool: UpstreamName | None = None
    # Paths into the arguments (keys joined by dots) whose values no view, export, log or
    # console shows, only a keyed digest (callgate.domain.redaction, ADR 0035).
    sensitive: tuple[str, ...] = ()
    # What the entry is to an ``mcp`` upstream (ADR 0044): a tool (``tools/call``), a
    # resource read (``resources/read`` of a URI the ``uris`` globs cover, target_arg
    # ``uri``) or a prompt (``prompts/get`` of ``upstream_tool``). A URI or prompt that no
    # entry covers is not served (fail closed).
    upstream_method: UpstreamMethod = "tools/call"
    uris: tuple[Glob, ...] = ()
    # ADR 0086: ``required``: ``callgate mcp`` serves the tool only to agents that declared
    # MCP Tasks, refusing others (``-32021``) before anything is proposed; either way a
    # declaring agent's call is a task when it waits.
    task_support: Literal["optional", "required"] = "optional"
    # ADR 0066: the digest of the upstream tool's definition this entry was reviewed
    # against; another definition served is refused (``tool_definition_changed``).
    pin: PinDigest | None = None

    @property
    def upstream_name(self) -> str:
        """The upstream tool that ``execute`` calls."""
        if self.upstream_tool is not None:
            return self.upstream_tool
        return self.name.removeprefix(f"{self.provider}.")

    def is_high_impact(self, args: Mapping[str, Any]) -> bool:
        """C4: high impact by catalog, or by threshold; a missing/non-numeric value is high."""
        if self.impact is Impact.HIGH:
            return True
        when = self.high_impact_when
        if when is None:
            return False
        value = args.get(when.arg)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return True
        return value >= when.gte

    def confirmation_for(self, args: Mapping[str, Any]) -> Confirmation:
        """The confirmation this call needs; high-impact calls always need an approver (C4)."""
        if self.is_high_impact(args):
            return Confirmation.APPROVER
        return self.confirmation

    def approvals_for(self, args: Mapping[str, Any]) -> int:
        """Distinct approvers this call needs (ADR 0030); a quorum is of approvers only."""
        if self.confirmation_for(args) is not Confirmation.APPROVER:
            return 1
        when = self.approvals_required_when
        if when is not None and args.get(when.arg) not in when.values:
            return 1
        return self.approvals_required

    @cached_property
    def args_schema_key(self) -> str:
        """Canonical text of ``args_schema``: a cheap cache key for compiled validators."""
        return canonical_json(self.args_schema)


class Profile(_Frozen):
    """A checked adoption profile: ``parse_profile`` builds it (from a file:
    ``adapters.profiles.load_profile``)."""

    version: Literal[1]
    tools: dict[str, ToolSpec]
    entry_limits: EntryLimits
    # ``limits:``: the usage limits (ADR 0079), in the order written.
    limits: tuple[UsageLimit, ...] = ()
    tenant_fields: tuple[Name, ...]
    resources: dict[Name, tuple[str, ...]]
    # ``providers:`` of the file (name -> settings with a ``kind``), checked per kind by
    # ``providers.registry``; None when the file has none (the bundled simulations).
    providers: dict[Name, dict[str, Any]] | None = None
    policy_text: str
    source: Path
    digest: str

    def tool(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def limits_of(self, tool: str) -> list[UsageLimit]:
        """The usage limits that cover ``tool`` (ADR 0079)."""
        return [limit for limit in self.limits if limit.covers(tool)]

    def provider_kind(self, name: str) -> str:
        """The declared kind of provider ``name``; undeclared ones are bundled simulations."""
        body = (self.providers or {}).get(name)
        return "simulated" if body is None else str(body["kind"])

    def dry_run_missing(self, spec: ToolSpec) -> str | None:
        """Why ``spec`` cannot have the dry-run it requires, or None (C5, fail closed).

        Simulated and HTTP providers answer dry-runs themselves; an MCP upstream has only
        the tools it lists, so its catalog entry must name the preview tool.
        """
        if not spec.require_dry_run or self.provider_kind(spec.provider) != "mcp":
            return None
        if spec.dry_run_tool is not None:
            return None
        return (
            f"{spec.name} requires a dry-run and its catalog entry names no dry_run_tool "
            f"of the upstream {spec.provider!r}"
        )

    @cached_property
    def resource_patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        return tuple(
            (tenant, re.compile("|".join(translate(g) for g in globs)))
            for tenant, globs in self.resources.items()
            if globs
        )

    def owner_of(self, target: str) -> str | None:
        """The tenant owning ``target`` (case-sensitive globs), or None (C7).

        A target claimed by two tenants is treated as unowned: the policy then denies
        it (fail closed) instead of handing it to whichever tenant is listed first.
        """
        owners = [t for t, pattern in self.resource_patterns if pattern.match(target)]
        return owners[0] if len(owners) == 1 else None

    def resource_entry(self, uri: str) -> ToolSpec | None:
        """The ``resources/read`` entry whose ``uris`` cover ``uri`` (case-sensitive globs);
        None when none does or when two do (fail closed, ADR 0044)."""
        found = [
            spec
            for spec in self.tools.values()
            if spec.upstream_method == "resources/read"
            and any(re.fullmatch(translate(g), uri) for g in spec.uris)
        ]
        return found[0] if len(found) == 1 else None

    def prompt_entry(self, provider: str, prompt: str) -> ToolSpec | None:
        """The ``prompts/get`` entry for an upstream's prompt, or None (fail closed)."""
        found = [
            spec
            for spec in self.tools.values()
            if spec.upstream_method == "prompts/get"
            and spec.provider == provider
            and spec.upstream_name == prompt
        ]
        return found[0] if len(found) == 1 else None

    def sensitive_paths(self) -> dict[str, tuple[str, ...]]:
        """Per tool with any, its ``sensitive`` argument paths (ADR 0035)."""
        return {name: spec.sensitive for name, spec in self.tools.items() if spec.sensitive}

    def catalog_view(self) -> list[dict[str, Any]]:
        """The tools with their flags and argument schemas (``callgate catalog``)."""
        return [spec.model_dump(mode="json") for spec in self.tools.values()]


class _ProfileFile(_Frozen):
    """The top level of the YAML file; tools are validated one by one for good errors."""

    version: Literal[1]
    policy_file: str
    entry_limits: EntryLimits = EntryLimits()
    limits: Any = None  # checked by ``usage.parse_limits`` for errors naming the entry
    tenant_fields: tuple[Name, ...] = ("tenant", "tenant_id", "org_id")
    resources: dict[Name, tuple[Glob, ...]] = {}
    providers: dict[Name, dict[str, Any]] | None = None
    tools: dict[Name, dict[str, Any]]


def default_profile_path() -> Path:
    """The shipped default adoption profile (``callgate/profiles/default.yaml``)."""
    return Path(str(files("callgate").joinpath("profiles", "default.yaml")))


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"field '{loc}': {first['msg']}{more}"


def _tool_problems(spec: ToolSpec) -> list[tuple[str, str]]:
    """Cross-field checks that keep the catalog internally consistent (fail closed)."""
    problems: list[tuple[str, str]] = []
    try:  # YAML has keys JSON has not (``~:``, ``1:``): a schema is JSON, or no schema
        canonical_json(spec.args_schema)
    except (TypeError, ValueError) as exc:
        return [("args_schema", f"not JSON: {exc}")]
    try:  # against the 2020-12 meta-schema, by the validator that checks the calls
        jsonschema_rs.meta.validate(spec.args_schema)
    except jsonschema_rs.ValidationError as exc:
        return [("args_schema", f"not a valid JSON Schema: {exc.message}")]
    if spec.args_schema.get("type") != "object":
        problems.append(("args_schema", "must have type: object"))
    props = spec.args_schema.get("properties", {})
    required = spec.args_schema.get("required", [])
    if spec.target_arg is not None and spec.target_arg not in required:
        problems.append(("target_arg", f"'{spec.target_arg}' must be a required argument"))
    for arg in spec.identity_args:
        if arg not in props:
            problems.append(("identity_args", f"'{arg}' is not an argument of the tool"))
    for path in spec.sensitive:
        schema: Any = spec.args_schema
        for name in path.split("."):
            found = schema.get("properties", {}).get(name) if isinstance(schema, dict) else None
            if found is None:
                problems.append(("sensitive", f"'{path}' is not a path into the arguments"))
                break
            schema = found
    if spec.high_impact_when is not None and spec.high_impact_when.arg not in props:
        arg = spec.high_impact_when.arg
        problems.append(("high_impact_when.arg", f"'{arg}' is not an argument of the tool"))
    if spec.upstream_method == "resources/read" and (spec.target_arg != "uri" or not spec.uris):
        problems.append(("uris", "a resources/read entry has target_arg 'uri' and uris globs"))
    if spec.uris and spec.upstream_method != "resources/read":
        problems.append(("uris", "only a resources/read entry covers URIs"))
    may_need_approver = (
        spec.impact is Impact.HIGH
        or spec.high_impact_when is not None
        or spec.confirmation is Confirmation.APPROVER
    )
    if may_need_approver and not spec.approvers:
        problems.append(("approvers", "the tool may need an approver but names no approver role"))
    return problems


def _catalog_entry(spec: ToolSpec) -> dict[str, Any]:
    """An entry as the profile digest covers it; ``sensitive`` only when set, so a profile
    without sensitive fields keeps its digest (the policy version)."""
    entry = spec.model_dump(mode="json")
    if not entry["sensitive"]:
        del entry["sensitive"]
    if entry["upstream_method"] == "tools/call" and not entry["uris"]:
        del entry["upstream_method"], entry["uris"]
    if entry["task_support"] == "optional":  # the default keeps the digest of before
        del entry["task_support"]
    return entry


# libyaml's safe loader where PyYAML has it (eight times quicker: every command loads the
# profile), else the pure-Python one; both build plain Python values only.
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictYamlLoader(_BASE_LOADER):  # type: ignore[misc]
    """The safe loader, refusing duplicate keys (YAML 1.2 forbids them; PyYAML keeps the
    last): a profile read differently by two tools must not load."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


_SAFE_LOADER = StrictYamlLoader


def parse_profile(
    text: str, path: Path, read_policy: Callable[[Path], str], *, recorded: bool = False
) -> Profile:
    """Check an adoption profile (C10) read from ``path``; any problem raises
    ``ProfileError``. ``read_policy`` gives the text of the policy file it names (the file
    reading is the caller's: ``callgate.adapters.profiles.load_profile``).

    ``recorded``: content read back from the log (a published policy version), where the
    entry limits written before ADR 0079 as a ``limits:`` mapping are still read as
    ``entry_limits:`` (a file or a candidate with that form is refused, naming the key)."""
    where = f"profile {path}"
    try:
        raw = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{where}: invalid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: expected a mapping at the top level")
    if recorded and isinstance(raw.get("limits"), dict) and "entry_limits" not in raw:
        raw = {**raw, "entry_limits": raw["limits"]}
        del raw["limits"]
    try:
        top = _ProfileFile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(f"{where}: {_describe(exc)}") from exc

    tools: dict[str, ToolSpec] = {}
    for name, body in top.tools.items():
        here = f"{where}: tool '{name}'"
        if not isinstance(body, dict):
            raise ProfileError(f"{here}: expected a mapping")
        if body.get("name", name) != name:
            raise ProfileError(f"{here}: field 'name': must equal the key '{name}' or be omitted")
        try:
            spec = ToolSpec.model_validate({**body, "name": name})
        except ValidationError as exc:
            raise ProfileError(f"{here}: {_describe(exc)}") from exc
        problems = _tool_problems(spec)
        mcp_fields = [
            f for f in ("upstream_tool", "dry_run_tool", "lookup_tool", "pin") if body.get(f)
        ]
        kind = (top.providers or {}).get(spec.provider, {}).get("kind", "simulated")
        if mcp_fields and kind != "mcp":
            problems.append((mcp_fields[0], f"only for tools of an mcp provider, not {kind}"))
        if top.providers is not None and spec.provider not in top.providers:
            problems.append(("provider", f"no provider named '{spec.provider}' in providers"))
        if problems:
            field, message = problems[0]
            raise ProfileError(f"{here}: field '{field}': {message}")
        tools[name] = spec

    try:
        limits = parse_limits(top.limits)
    except ValueError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    for limit in limits:
        covered = [name for name in tools if limit.covers(name)]
        if not covered:
            raise ProfileError(f"{where}: limits[{limit.name}]: tools: cover no tool")
        for name in covered:
            problem = schema_problem(limit, name, tools[name].args_schema)
            if problem is not None:
                raise ProfileError(f"{where}: limits[{limit.name}]: arg: {problem}")
            if limit.over == "approve" and not tools[name].approvers:
                message = f"tool '{name}' names no approver role to lift the limit"
                raise ProfileError(f"{where}: limits[{limit.name}]: over: {message}")

    for name, body in (top.providers or {}).items():
        if not isinstance(body.get("kind"), str):
            raise ProfileError(f"{where}: providers.{name}.kind: required (the provider kind)")
    policy_path = path.parent / top.policy_file
    policy_text = read_policy(policy_path)
    catalog = {
        "version": top.version,
        # The entry limits kept this name in the digest (ADR 0079): a profile without usage
        # limits keeps the policy version it had.
        "limits": top.entry_limits.model_dump(mode="json"),
        **({"usage_limits": [u.model_dump(mode="json") for u in limits]} if limits else {}),
        "tenant_fields": list(top.tenant_fields),
        "resources": {k: list(v) for k, v in top.resources.items()},
        # Only when declared, so that a profile without providers keeps its digest.
        **({"providers": top.providers} if top.providers else {}),
        "tools": {k: _catalog_entry(v) for k, v in tools.items()},
    }
    return Profile(
        version=top.version,
        tools=tools,
        entry_limits=top.entry_limits,
        limits=limits,
        tenant_fields=top.tenant_fields,
        resources=top.resources,
        providers=top.providers,
        policy_text=policy_text,
        source=path,
        digest=sha256_hex(canonical_json({"catalog": catalog, "policy": policy_text})),
    )
