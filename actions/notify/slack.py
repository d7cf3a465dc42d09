"""Slack, with the official slack-sdk's Web API client (SLACK_BOT_TOKEN, SLACK_API_URL): a
message per pending interrupt in the team's channel (or to its assignees directly) with Approve,
Reject and Open buttons; the message updated in place once it is decided, however it was
decided; a reminder in its thread before the deadline. The buttons come back to
actions.web.slack, which decides through the engine."""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from django.utils import timezone
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from actions.models import Interrupt, Notification, Preferences, SlackMessage, TeamChannels
from actions.notify.base import ASKS_ANEW, DeliveryFailed, Notify, NotSent, Transport, absolute

APPROVE, REJECT, OPEN = "grundlag_approve", "grundlag_reject", "grundlag_open"
# Slack's errors that trying again later does not mend.
PERMANENT = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "missing_scope",
        "users_not_found",
        "user_not_found",
        "invalid_blocks",
        "msg_too_long",
    }
)
VERDICTS = {"approved": "Approved", "rejected": "Rejected", "expired": "Expired", "cancelled": "Cancelled"}


def client() -> WebClient:
    return WebClient(
        token=settings.SLACK_BOT_TOKEN,
        base_url=settings.SLACK_API_URL,
        timeout=math.ceil(settings.GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS),  # whole seconds
    )


def escape(text: Any) -> str:
    """Text for Slack's mrkdwn: its three control characters escaped, nothing else."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return escape(text if len(text) <= 200 else text[:200] + "…")


def _when(value: Any) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M %Z") if value else ""


def blocks(interrupt: Interrupt) -> list[dict[str, Any]]:
    """The message: the question, its data, where it comes from, and while pending the buttons;
    once decided, who decided and when in their place."""
    shown: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{escape(interrupt.message)[:2900]}*"}}
    ]
    data = interrupt.data if isinstance(interrupt.data, dict) else {"data": interrupt.data}
    fields = [
        {"type": "mrkdwn", "text": f"*{escape(str(key)[:100])}*\n{_value(item)}"}
        for key, item in list(data.items())[:10]
    ]
    if fields:
        shown.append({"type": "section", "fields": fields})
    where = f"{escape(interrupt.team.name)} · {escape(interrupt.action)} · run {interrupt.run_id}"
    if interrupt.expires_at and interrupt.is_pending:
        where += f" · deadline {_when(interrupt.expires_at)}"
    shown.append({"type": "context", "elements": [{"type": "mrkdwn", "text": where}]})
    url = absolute(interrupt.get_absolute_url())
    if interrupt.is_pending:
        value = str(interrupt.pk)
        shown.append(
            {
                "type": "actions",
                "block_id": f"grundlag_{interrupt.pk}",
                "elements": [
                    {
                        "type": "button",
                        "action_id": APPROVE,
                        "style": "primary",
                        "value": value,
                        # One click in a busy channel is easily a mistake: Slack asks first.
                        "confirm": {
                            "title": {"type": "plain_text", "text": "Approve?"},
                            "text": {"type": "plain_text", "text": interrupt.message[:300] or "Approve?"},
                            "confirm": {"type": "plain_text", "text": "Approve"},
                            "deny": {"type": "plain_text", "text": "Not yet"},
                        },
                        "text": {"type": "plain_text", "text": "Approve"},
                    },
                    {
                        "type": "button",
                        "action_id": REJECT,
                        "style": "danger",
                        "value": value,
                        "text": {"type": "plain_text", "text": "Reject"},
                    },
                    {
                        "type": "button",
                        "action_id": OPEN,
                        "url": url,
                        "text": {"type": "plain_text", "text": "Open"},
                    },
                ],
            }
        )
    else:
        shown.append({"type": "section", "text": {"type": "mrkdwn", "text": verdict(interrupt)}})
    return shown


def verdict(interrupt: Interrupt) -> str:
    said = VERDICTS.get(interrupt.status, interrupt.status.capitalize())
    who = escape(interrupt.decided_by_name or "policy")
    text = f"*{said}* by {who} at {_when(interrupt.decided_at)}"
    if interrupt.reason:
        text += f"\n>{escape(interrupt.reason)[:500]}"
    return text


def summary(interrupt: Interrupt) -> str:
    """The notification's text (what phones and screen readers show), escaped: a message that
    says <!channel> or <https://elsewhere|Approve> must not ping or link."""
    said = "Approval needed" if interrupt.is_pending else VERDICTS.get(interrupt.status, interrupt.status)
    return f"{said}: {escape(interrupt.message[:300])}"


def slack_user_of(user: Any) -> str:
    """A person's Slack user id: set in their preferences, else found by their mail address."""
    prefs = Preferences.objects.filter(user=user).first()
    if prefs is not None and prefs.slack_user_id:
        return prefs.slack_user_id
    if not user.email:
        raise NotSent(f"{user.get_username()} has no mail address to find in Slack")
    found = client().users_lookupByEmail(email=user.email)  # users_not_found: NotSent, in send()
    return str(found["user"]["id"])


def send(notification: Notification) -> int:
    # Every Slack message is about an interrupt: its event names it (one its run's end
    # cancelled has its own). Older notifications named it in the payload.
    event = notification.event
    interrupt_id = (event.interrupt_id if event is not None else None) or notification.payload.get(
        "slack_interrupt"
    )
    if interrupt_id is None:
        raise DeliveryFailed("a Slack notification is about an interrupt")
    interrupt = Interrupt.objects.select_related("team").get(pk=interrupt_id)
    try:
        if notification.type in ASKS_ANEW:
            _ask(notification, interrupt)
        elif notification.type == "interrupt.expiring":
            _remind(interrupt)
        elif notification.type == "interrupt.commented":
            _mention(notification, interrupt)
        else:
            _update(interrupt)
    except SlackApiError as exc:
        error = exc.response.get("error")
        if error in PERMANENT:
            raise NotSent(f"Slack said {error}, which no retry mends") from None
        raise DeliveryFailed(f"Slack said {error}", exc.response.status_code) from None
    except SlackClientError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    except OSError as exc:  # refused, timed out
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    return 200


def _ask(notification: Notification, interrupt: Interrupt) -> None:
    to = notification.payload.get("slack_channel") or ""
    if not to and notification.recipient is not None:
        to = slack_user_of(notification.recipient)  # a direct message
    if not to:
        raise DeliveryFailed("no Slack channel or user to post to")
    posted = client().chat_postMessage(channel=to, text=summary(interrupt), blocks=blocks(interrupt))
    SlackMessage.objects.get_or_create(
        interrupt=interrupt, channel=str(posted["channel"]), defaults={"ts": str(posted["ts"])}
    )


def _mention(notification: Notification, interrupt: Interrupt) -> None:
    """A comment that names the recipient: a direct message with the comment and a link."""
    if notification.recipient is None:
        raise DeliveryFailed("a mention is told to someone")
    data = notification.payload.get("data", {})
    said = data.get("comment") or {}
    link = f"<{data.get('url', '')}|{escape(interrupt.message)}>"
    quoted = "\n".join(f"> {escape(line)}" for line in str(said.get("body", "")).splitlines())
    text = f"{escape(said.get('by') or 'Someone')} mentioned you on {link}:\n{quoted}"
    client().chat_postMessage(channel=slack_user_of(notification.recipient), text=text)


def _pending_ask(interrupt: Interrupt) -> bool:
    return Notification.objects.filter(
        event__interrupt=interrupt,
        channel=Notification.Channel.SLACK,
        type__in=ASKS_ANEW,
        outcome=Notification.Outcome.PENDING,
    ).exists()


def _update(interrupt: Interrupt) -> None:
    if _pending_ask(interrupt):
        # A message still being posted (an escalation's, a retried one) would keep its buttons.
        raise DeliveryFailed("a message to update is not posted yet")
    messages = list(SlackMessage.objects.filter(interrupt=interrupt))
    web = client()
    for message in messages:
        web.chat_update(
            channel=message.channel, ts=message.ts, text=summary(interrupt), blocks=blocks(interrupt)
        )


def _remind(interrupt: Interrupt) -> None:
    if not interrupt.is_pending:
        return
    if _pending_ask(interrupt):
        raise DeliveryFailed("a message to remind in is not posted yet")
    messages = list(SlackMessage.objects.filter(interrupt=interrupt))
    web = client()
    for message in messages:
        web.chat_postMessage(
            channel=message.channel,
            thread_ts=message.ts,
            text=f"Still waiting: the deadline is {_when(interrupt.expires_at)}.",
        )


def asked_in_slack(it: Interrupt) -> bool:
    """Whether a message in Slack asked for this interrupt's decision (or is about to)."""
    return (
        SlackMessage.objects.filter(interrupt=it).exists()
        or Notification.objects.filter(
            event__interrupt=it, channel=Notification.Channel.SLACK, type__in=ASKS_ANEW
        ).exists()
    )


class SlackTransport(Transport):
    channel = Notification.Channel.SLACK

    def send(self, notification: Notification) -> int:
        return send(notification)

    def to_people(
        self,
        it: Interrupt,
        kind: str,
        body: dict[str, Any],
        notify: Notify,
        routing: TeamChannels,
        people: list[Any],
    ) -> None:
        if not settings.SLACK_BOT_TOKEN:
            return
        if kind == "interrupt.decided":
            # Whatever the routing says now, a message that asked loses its buttons.
            if asked_in_slack(it):
                notify(self.channel, "s", body)
            return
        if kind not in routing.slack_events:
            return
        if kind == "interrupt.expiring":
            # Answered in the threads of the messages that asked.
            if asked_in_slack(it):
                notify(self.channel, "s", body)
        elif it.assignees:
            # Assigned: to the assignees alone, as direct messages.
            for user in people:
                notify(self.channel, f"d{user.pk}", {**body, "slack_user": user.pk}, recipient=user)
        elif routing.slack_channel:
            notify(self.channel, f"s{routing.team_id}", {**body, "slack_channel": routing.slack_channel})

    def to_mentioned(self, user: Any, body: dict[str, Any], notify: Notify) -> None:
        """Where Slack is set up, a direct message."""
        if settings.SLACK_BOT_TOKEN:
            notify(self.channel, f"d{user.pk}", body, recipient=user)


TRANSPORT = SlackTransport()
