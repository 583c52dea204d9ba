"""The policy engine: every call, read or write, gets a Cedar decision (C1, C2, C3, C7).

The policy set is the profile's Cedar text plus one generated permit per tool,
``@id("callers:<tool>")``, that allows the tool's catalog ``callers`` roles. It is
parsed once and reused; so are the Cedar entities (the principal's, and the principal's
with a resource's), kept in bounded caches that live as long as the engine, that is one
policy version. Cedar still evaluates every call: only parsing is saved.

Each call is evaluated against the policies whose action scope can match its tool
(``_for_action``): the whole set less those scoped to other actions, cut once per tool
from the parsed set's nodes with their ids kept. A policy whose scope is
``action == Action::"other"`` or ``action in [...]`` without the tool is never satisfied
by the call and Cedar never evaluates its conditions (no ``Action`` entities are given,
so ``in`` is equality), so the decision, its determining policies and its errors are the
whole set's (``tests/unit/test_policy_slices.py``); a set the nodes cannot represent is
used whole. A slice none of whose policies reads ``context`` gets an empty one: Cedar
reaches a request's context only through that variable, so its value cannot change the
answer, and building and parsing it was a third of a decision.

Each decision evaluates, for the *session* principal (C6), ``User::"<user>"`` doing
``Action::"<tool>"`` on ``Resource::"<target>"``, after the arguments were validated
(C7). Reads need nothing more than this ACL decision (C2); mutations need it as their
session authorization (C3).

Fail closed: Cedar skips a policy whose evaluation errors, which would silently drop
a ``forbid``. So any evaluation error is a deny here, as is a principal without a
tenant and a resource that no tenant owns (the default ``tenant-isolation`` forbid).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Final

import cedarpy
import orjson
from cedarpy import _internal as cedar_engine
from cedarpy import pst

from callgate.domain.canonical import canonical_json
from callgate.domain.catalog import Profile, ProfileError, ToolSpec
from callgate.domain.principal import Principal

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_SKIP: Final = object()
# Bounds of the entity caches: sessions in use, and (session, resource) pairs in use.
_PRINCIPALS_CACHED: Final = 1024
# A principal entity is cached by what it holds: user, tenant, roles, agent, delegation.
_Who = tuple[str, str, tuple[str, ...], str, tuple[str, ...]]
# Each pair is about 3 KB of Cedar's own (Rust) memory: 8,192 of them held 25 MB per
# deciding process, filled slowly by distinct resources (the soak's RSS). A miss parses
# only the resource (about 3 µs), so a small bound costs next to nothing.
_ENTITIES_CACHED: Final = 1024


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """The outcome recorded as ``authorized_by`` (C9); ``policy_version`` is the profile digest.

    ``determining_policies`` holds the ``@id`` of the policies that decided (the
    permit(s) on allow, the forbid(s) on an explicit deny); it is empty for the implicit
    deny (no permit matched) and for a deny caused by evaluation errors.
    """

    allowed: bool
    determining_policies: tuple[str, ...]
    policy_version: str
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ResourceFacts:
    """Who owns a target and its attributes, as the ACL evaluates them (C7, ADR 0014).

    ``source`` is ``"profile"`` (a static ``resources`` glob), ``"provider:<name>"`` (the
    system of record's ``describe``) or ``"new"`` (a call that creates a resource, owned
    by the session tenant). ``tenant`` None: nobody owns it, and the default policy denies.
    """

    source: str
    tenant: str | None
    attributes: Mapping[str, Any]
    message: str = ""

    def to_json(self) -> str:
        """What ``PolicyDecided.resource_json`` records, so replay sees the same facts."""
        body: dict[str, Any] = {
            "source": self.source,
            "tenant": self.tenant,
            "attributes": dict(self.attributes),
        }
        if self.message:
            body["message"] = self.message
        return canonical_json(body)

    @classmethod
    def from_json(cls, text: str) -> ResourceFacts:
        """The facts ``to_json`` wrote."""
        body = json.loads(text)
        return cls(body["source"], body["tenant"], body["attributes"], body.get("message", ""))


NEW_RESOURCE: Final = ResourceFacts(source="new", tenant=None, attributes={})


def generated_policies(profile: Profile) -> str:
    """One permit per tool for its catalog ``callers`` (C1, C10); no callers, no permit.

    Tool and role names are restricted by the catalog to a quote-free alphabet, so they
    are safe to place inside Cedar string literals.
    """
    parts = []
    for name, spec in profile.tools.items():
        if not spec.callers:
            continue
        roles = ", ".join(f'"{role}"' for role in spec.callers)
        parts.append(
            f'@id("callers:{name}")\n'
            f'permit (principal, action == Action::"{name}", resource)\n'
            f"when {{ principal.roles.containsAny([{roles}]) }};\n"
        )
    return "\n".join(parts)


def _cedar_value(value: Any) -> Any:
    """The part of an argument value Cedar can hold: no null, no float, i64 ints only.

    Keys starting with ``__`` are dropped: Cedar's JSON reads ``__entity``/``__extn``
    as escapes, and model-written arguments must not forge entity references.
    """
    if isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return value if _I64_MIN <= value <= _I64_MAX else _SKIP
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, str) and not key.startswith("__"):
                converted = _cedar_value(item)
                if converted is not _SKIP:
                    out[key] = converted
        return out
    if isinstance(value, list | tuple):
        return [c for c in (_cedar_value(v) for v in value) if c is not _SKIP]
    return _SKIP


class PolicyEngine:
    """Cedar evaluation for one profile; build once, call ``decide`` per proposal."""

    def __init__(self, profile: Profile) -> None:
        where = f"profile {profile.source}: policy_file"
        try:
            cedarpy.PolicySet.from_str(profile.policy_text)  # errors point at the adopter's file
        except ValueError as exc:
            raise ProfileError(f"{where}: invalid Cedar: {exc}") from exc
        self._profile = profile
        self.policy_text = generated_policies(profile) + "\n" + profile.policy_text
        try:
            self._policies = cedarpy.PolicySet.from_str(self.policy_text)
        except ValueError as exc:
            raise ProfileError(f"{where}: cannot combine with generated policies: {exc}") from exc
        self._principals: dict[_Who, Any] = {}
        self._pairs: dict[tuple[_Who, str], Any] = {}
        self._nodes = _static_nodes(self._policies)
        self._slices: dict[str, _Slice] = {}

    def _for_action(self, action: str) -> _Slice:
        """The parsed policies that can apply to ``Action::"<action>"`` (module docstring),
        cut once per action; the whole set when it cannot be cut."""
        found = self._slices.get(action)
        if found is None:
            found = self._slices[action] = self._cut(action)
        return found

    def _cut(self, action: str) -> _Slice:
        if self._nodes is None:
            return _Slice(self._policies, reads_context=True)
        kept = {k: t for k, t in self._nodes.items() if _may_match(t.action, action)}
        reads_context = _reads_context(kept)
        if len(kept) == len(self._nodes):
            return _Slice(self._policies, reads_context)
        try:
            return _Slice(cedarpy.PolicySet.from_pst(pst.PolicySet({}, kept, ())), reads_context)
        except (TypeError, ValueError):
            return _Slice(self._policies, reads_context=True)

    @property
    def policy_version(self) -> str:
        return self._profile.digest

    def _resource(
        self, principal: Principal, spec: ToolSpec, target: str, facts: ResourceFacts | None
    ) -> dict[str, Any]:
        if spec.target_arg is None:
            # A new resource is created in the session tenant.
            uid = {"type": "Resource", "id": f"new:{spec.name}"}
            return {"uid": uid, "attrs": {"tenant": principal.tenant}, "parents": []}
        if facts is None:
            owner = self._profile.owner_of(target) if target else None
            facts = ResourceFacts("profile", owner, {})
        # The provider's attributes are entity attributes (``resource.tier``); the owner
        # is ``resource.tenant`` and no attribute may stand in for it.
        attrs = {k: v for k, v in _cedar_value(dict(facts.attributes)).items() if k != "tenant"}
        if facts.tenant is not None:
            attrs["tenant"] = facts.tenant
        return {"uid": {"type": "Resource", "id": target}, "attrs": attrs, "parents": []}

    def _entities(self, principal: Principal, resource: dict[str, Any]) -> Any:
        """The parsed entities of one request: the principal's, plus the resource's.

        Parsing is most of a decision's cost (the user entity alone about 6 µs, both
        about 9 µs), so the principal's entity is parsed once per principal and the pair
        once per (principal, resource entity): a miss parses only the resource and adds
        it. The key is the resource entity's JSON text, owner and attributes included, so
        a change of what the provider reports is a new entry, never a stale one.
        """
        who = (
            principal.user,
            principal.tenant,
            principal.roles,
            principal.agent,
            principal.delegation,
        )
        resource_json = _to_json([resource])
        key = (who, resource_json)
        found = self._pairs.get(key)
        if found is not None:
            return found
        base = self._principals.get(who)
        if base is None:
            base = cedar_engine.Entities.from_json_str(_to_json([user_entity(principal)]), None)
            _put(self._principals, who, base, _PRINCIPALS_CACHED)
        pair = base.with_added_json_str(resource_json, None)
        _put(self._pairs, key, pair, _ENTITIES_CACHED)
        return pair

    def request(
        self,
        principal: Principal,
        spec: ToolSpec,
        target: str,
        args: Mapping[str, Any],
        facts: ResourceFacts | None = None,
        usage: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The Cedar request ``decide`` evaluates (context as JSON text) and the resource
        entity it adds to the principal's: what the benchmark hands ``cedarpy`` itself."""
        resource = self._resource(principal, spec, target, facts)
        context = "{}"
        if self._for_action(spec.name).reads_context:
            # JSON text: cedarpy would ``json.dumps`` a dict, a quarter of a decision.
            context = _to_json(
                {
                    "tool": spec.name,
                    "mutation": spec.mutation,
                    "high_impact": spec.is_high_impact(args),
                    "args": _cedar_value(args),
                    # ADR 0079: per limit that covers the call, the usage before it.
                    **({"usage": _cedar_value(usage)} if usage is not None else {}),
                }
            )
        request = {
            "principal": {"type": "User", "id": principal.user},
            "action": {"type": "Action", "id": spec.name},
            "resource": resource["uid"],
            "context": context,
        }
        return request, resource

    def decide(
        self,
        principal: Principal,
        spec: ToolSpec,
        target: str,
        args: Mapping[str, Any],
        facts: ResourceFacts | None = None,
        usage: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> PolicyDecision:
        """The Cedar decision for the session principal on ``spec`` at ``target`` (C1, C7).

        ``facts``: the target's owner and attributes (from the profile or the provider);
        without them the profile's static ``resources`` are used. ``usage``: the usage of
        the limits that cover the call (``context.usage``, ADR 0079); a policy that reads
        the usage of a call no limit covers fails to evaluate, which denies."""
        version = self._profile.digest
        if not principal.tenant:
            return PolicyDecision(False, (), version, ("principal has no tenant",))
        policies = self._for_action(spec.name)
        try:
            request, resource = self.request(principal, spec, target, args, facts, usage)
            entities = self._entities(principal, resource)
            # cedarpy's Rust entry point, called as its ``is_authorized`` wrapper does; the
            # wrapper's ``json.loads`` and result objects cost an eighth of a decision.
            # The version is pinned by the lock and test_policy checks every field read.
            answer = orjson.loads(
                cedar_engine.is_authorized(request, policies.policies, entities, None, False)
            )
            diagnostics = answer["diagnostics"]
            errors = tuple(str(e) for e in diagnostics.get("errors", ()))
            if errors:
                return PolicyDecision(False, (), version, errors)
            names = diagnostics.get("id_annotations_by_reason", {})
            reasons = diagnostics.get("reason", ())
            determining = tuple(sorted(str(names.get(r, r)) for r in reasons))
            allowed = answer["decision"] == "Allow"
        except Exception as exc:  # any engine failure is a deny, never a crash-through
            return PolicyDecision(False, (), version, (f"policy evaluation failed: {exc}",))
        return PolicyDecision(allowed, determining, version)


def user_entity(principal: Principal) -> dict[str, Any]:
    """The session principal as a Cedar entity: its tenant, roles, agent (the client
    acting for the user, ``""`` when the token names none) and delegation (the ``act``
    chain's subjects, a set), from the session."""
    return {
        "uid": {"type": "User", "id": principal.user},
        "attrs": {
            "tenant": principal.tenant,
            "roles": list(principal.roles),
            "agent": principal.agent,
            "delegation": list(principal.delegation),
        },
        "parents": [],
    }


@dataclass(frozen=True, slots=True)
class _Slice:
    """The policies one action is evaluated against, and whether any of them reads
    ``context`` (when none does, the request carries an empty one)."""

    policies: Any
    reads_context: bool


def _reads_context(nodes: Mapping[str, pst.Template]) -> bool:
    """True when ``Var("context")`` occurs anywhere in ``nodes``; a node of a kind this
    walk does not know is read as its fields, so nothing is missed."""
    stack: list[Any] = list(nodes.values())
    while stack:
        value = stack.pop()
        if isinstance(value, pst.Var):
            if value.name == "context":
                return True
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, tuple):
            stack.extend(value)
        elif is_dataclass(value) and not isinstance(value, type):
            stack.extend(getattr(value, f.name) for f in fields(value))
    return False


def _static_nodes(policies: Any) -> dict[str, pst.Template] | None:
    """The set's static policies as nodes by id; None (use the set whole) when it holds
    templates or syntax the nodes do not model."""
    try:
        nodes = policies.to_pst()
    except ValueError:
        return None
    if nodes.templates or nodes.template_links:
        return None
    return dict(nodes.static_policies)


def _may_match(scope: Any, action: str) -> bool:
    """False only for an action scope that ``Action::"<action>"`` cannot satisfy."""
    wanted = pst.EntityUid(pst.EntityType("Action", ()), action)
    if isinstance(scope, pst.ActionEq):
        return bool(scope.entity == wanted)
    if isinstance(scope, pst.ActionIn):
        return wanted in scope.entities
    return True  # ``action`` unconstrained, or a scope this code does not know: kept


def _put(cache: dict[Any, Any], key: Any, value: Any, bound: int) -> None:
    """Insert into a bounded cache, dropping the oldest entry when full."""
    if len(cache) >= bound:
        cache.pop(next(iter(cache)), None)
    cache[key] = value


def _to_json(value: Any) -> str:
    """JSON text for Cedar; ``json`` where orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)
