"""What the composition root hands the decider (C10: the catalog, not the prompt, says
what a tool is; C1: the policy engine decides; C6, C11: session and approval keys)."""

from __future__ import annotations

from dataclasses import dataclass, field

from callgate.domain.approvals import ApprovalSigner, ApprovalVerifier
from callgate.domain.catalog import Profile
from callgate.domain.freeze import Freezes
from callgate.domain.identity import SessionVerifier
from callgate.domain.pins import Pins
from callgate.domain.policy import PolicyEngine


@dataclass(frozen=True)
class DeciderDeps:
    """What the composition root hands the decider: catalog, policy and key material."""

    profile: Profile
    policy: PolicyEngine
    sessions: SessionVerifier
    approval_signer: ApprovalSigner
    approval_verifier: ApprovalVerifier
    # The freezes in force (ADR 0054): folded by the decider from the freeze events it
    # reads, seeded by the runner with those before its position.
    freezes: Freezes = field(default_factory=Freezes)
    # The pins and the upstream definitions last seen (ADR 0066), folded the same way.
    pins: Pins = field(default_factory=Pins)


__all__ = ["DeciderDeps"]
