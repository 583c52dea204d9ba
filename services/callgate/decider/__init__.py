"""The invocation decider (C1-C12), one pure process split by the rule each module holds.

Only ``Decider`` and ``DeciderDeps`` are the package's interface; its state lives in
``callgate.decider.state``. Where each clause of the contract (docs/contract.md) is enforced:

- C1 proposal is not permission (a policy decision for every call): ``proposals``
- C2 reads after the ACL alone; C3 mutations after session authorization:
  ``proposals`` (policy), ``authorization`` (what follows a permit)
- C4 high impact needs an approval bound to the exact call: ``approvals``
  (bindings, presented approvals), ``proposals`` (``high_impact`` on the record)
- C5 dry-run is what the human confirms: ``authorization`` (request, re-run at
  confirmation), ``outcomes`` (dry-run results, snapshot hash compared)
- C6 identity from the session; C7 ACL after schema validation: ``proposals``
- C8 idempotency is replay protection only: ``idempotency`` (known keys),
  ``key_records`` (waiters replayed), ``approvals`` (single use, replay of the
  authorized call), ``authorization`` (``reject_late`` frees the key)
- C9 audit (``proposed_by``/``authorized_by``): ``proposals`` (actor recorded early),
  ``outcomes`` (a retry names the approval it completes)
- C10 catalog, not prompt: ``proposals`` (tool spec from ``deps.profile``), ``deps``
- C11 approval artifacts, short-lived and bound: ``approvals`` (grant, sign, check),
  ``decider`` (``due``: expiry timers)
- C12 failures: ``proposals`` (``tool_forbidden`` never reaches a provider),
  ``outcomes`` (uncertain → reconcile → execute once), ``idempotency`` (reconcile
  before a same-key retry)
- V1 model-supplied user id → ``identity_spoof``: ``proposals`` (``check_identity``)
- V2 swapped arguments → ``approval_mismatch``, one side effect: ``approvals``
  (``require_match``), ``outcomes`` (dry-run hash), ``idempotency`` (replay)

The rule modules decide: they read state and emit events. ``evolve`` alone changes the
immutable state (``state``), one event at a time, so a key's state is the fold of its events
(ADR 0092). The other modules: ``decider`` (the ``Decider`` class: Process protocol,
``reacts_to``, ``handle`` as decide then fold, ``due`` timers), ``emitter`` (follow-on event
envelopes, each folded as it is emitted) and ``usage_process`` (the limits' keyed process,
decide and evolve too).
"""

from callgate.decider.decider import Decider
from callgate.decider.deps import DeciderDeps

__all__ = ["Decider", "DeciderDeps"]
