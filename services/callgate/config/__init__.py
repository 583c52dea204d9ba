"""The configuration file ``callgate.toml`` and ``CALLGATE_*`` variables
(docs/reference/configuration.md).

``Settings`` (``settings.py``) is one frozen model; ``loading`` fills it from, in
increasing precedence: its defaults, the configuration file, ``CALLGATE_*`` environment
variables (nested keys with ``__``: ``CALLGATE_APPROVALS__SIGNING_KID``) and command-line
options. The file is ``--config FILE`` / ``CALLGATE_CONFIG``, else ``callgate.toml`` in
the state directory when it exists. Relative paths in the file are relative to the file;
those in variables and options to the working directory.

Every problem raises ``ConfigError`` naming where the bad value came from (the file and
the key, the variable, or the option), so a broken configuration fails at start. Key
files named by the configuration are read at start too (``key_material``:
``trusted_issuers``, ``approval_keys``), for the same reason. See
docs/adr/0013-configuration-and-dev-mode.md.

The modules: ``sections`` (the settings' sections, each a frozen model), ``loading`` (file,
variables and options merged and validated), ``key_material`` (the keys the configuration
names) and ``redaction`` (what ``callgate config check`` hides).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key (or variable)."""
