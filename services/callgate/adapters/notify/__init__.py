"""Telling approvers (ADR 0032): the consumer of the pending view, and its deliveries to
webhooks (Standard Webhooks, via the ``standardwebhooks`` library) and Slack
(``slack_sdk``), retried with backoff and dead-lettered to a JSON-lines file.

Wired by the composition root into ``callgate serve --http``. What to tell is decided by
the pure ``callgate.domain.notices``; this package reads the views, sends, waits, retries
and writes dead letters. ``slack.SlackInteractions`` verifies Slack's request signatures
and maps a Slack user to the callgate identity configured for them; the decision itself
goes through the same approval API as the console's (``Gateway.approve``/``deny``).

One module per part: ``notifier`` (follows the pending view, tells the targets),
``deliveries`` (the sending thread, its retries and dead letters), ``webhook`` and
``slack`` (the channels), ``callbacks`` (ARAP callbacks to a registered webhook) and
``reader`` (the views they read).
"""
