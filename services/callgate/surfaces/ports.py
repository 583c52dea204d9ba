"""The port of the surfaces: what the command line, HTTP, MCP and Slack surfaces need from
the composition root. ``callgate.bootstrap.App`` is its one implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from callgate.application.ports import Ports

if TYPE_CHECKING:
    from callgate.adapters.notify.notifier import Notifier
    from callgate.adapters.notify.reader import PendingReader
    from callgate.adapters.notify.slack import SlackInteractions
    from callgate.adapters.oidc import Discovery
    from callgate.application.client import Gateway
    from callgate.config.key_material import ApprovalKeys
    from callgate.domain.identity import TrustedIssuer


class Surface(Ports, Protocol):
    """What surfaces need from the composition root (``callgate.bootstrap.App``): the
    use cases' ports, and the client and adapters each surface serves with."""

    @property
    def approval_keys(self) -> ApprovalKeys: ...
    @property
    def discovery(self) -> Discovery:
        """The identity providers' discovery documents and keys."""
        ...

    @property
    def trusted_issuers(self) -> list[TrustedIssuer]:
        """The configured session issuers (keys, claims mapping, binding)."""
        ...

    @property
    def request_state_key(self) -> bytes:
        """The key sealing MCP ``requestState`` (ADR 0065)."""
        ...

    @property
    def slack_interactions(self) -> SlackInteractions | None:
        """Slack's Approve/Deny clicks (``[slack]``), None when Slack is not configured."""
        ...

    def notifier(self, reader: PendingReader) -> Notifier | None:
        """Tells approvers of the pending view's changes (``[notify]``, ``[slack]``)."""
        ...

    def gateway(self) -> Gateway:
        """A client on the backend the settings name (embedded by default)."""
        ...
