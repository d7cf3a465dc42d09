"""Reaching reviewers and calling applications outside the dashboard.

The run's event log is the outbox: an event is written in the transaction of its change, so a
rolled-back change tells nobody. After commit, and every few seconds to catch up (a process
that died between its commit and the dispatch), the dispatcher (``dispatch``) turns each event
worth telling into one ``Notification`` per recipient, once (``Fanout``). Each notification is
delivered with retries and exponential backoff (``delivery``), every attempt recorded: an
event's mails and Slack messages a few to a task, each webhook in a task of its own, so that a
slow or dead endpoint holds up only its own delivery, never a decision.

Channels, one module each: ``webhook`` (Standard Webhooks, signed), ``email`` (Django's mail,
with a personal decision link: ``links``), ``slack`` (slack-sdk; its buttons come back to
actions.web.slack)."""

from actions.notify.delivery import deliver, deliver_due, deliver_in, on_audit_head, redeliver
from actions.notify.dispatch import (
    dispatch,
    dispatch_missed,
    dispatch_soon,
    on_discussed,
    on_run_changed,
    periodic_round,
)

__all__ = [
    "deliver",
    "deliver_due",
    "deliver_in",
    "dispatch",
    "dispatch_missed",
    "dispatch_soon",
    "on_audit_head",
    "on_discussed",
    "on_run_changed",
    "periodic_round",
    "redeliver",
]
