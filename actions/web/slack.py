"""Slack's interactions (the app's Interactivity Request URL, ``POST /slack/interactions``):
the Approve and Reject buttons of actions.notify.slack and the modal they may open. Every
request must carry Slack's signature of its body, made with SLACK_SIGNING_SECRET, and a
timestamp within five minutes. The Slack user is mapped to a person here (their preferences'
Slack id, else Slack's confirmed mail address matching exactly one active user), who decides
through the engine with every rule of the dashboard: team, assignment, N-of-M, separation of
duties, exactly once. Whoever is not mapped or not allowed is told so, privately."""

from __future__ import annotations

import html
import json
import logging
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier

from actions import engine
from actions.models import Interrupt, Preferences
from actions.notify import slack
from actions.web.forms import ApprovalForm, RejectForm, SchemaForm, answer_form

logger = logging.getLogger(__name__)

User = get_user_model()


class Refused(Exception):
    """Said privately to the Slack user; nothing changed."""


def _verified(request: HttpRequest) -> bool:
    if not settings.SLACK_SIGNING_SECRET:
        return False
    try:
        return SignatureVerifier(settings.SLACK_SIGNING_SECRET).is_valid_request(
            request.body, dict(request.headers)
        )
    except ValueError:  # a timestamp that is not a number
        return False


@csrf_exempt
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    if not _verified(request):
        return HttpResponse("bad or missing Slack signature, or a stale timestamp", status=401)
    try:
        payload = json.loads(request.POST.get("payload", ""))
        kind = payload["type"]
        slack_user = str(payload["user"]["id"])
        workspace = (payload.get("team") or {}).get("id") or payload["user"].get("team_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        return HttpResponse("not an interaction payload", status=400)
    if workspace != home_workspace():
        # A shared channel (Slack Connect) or a second installation: another organisation's
        # users, whose mail addresses that organisation controls, decide nothing here.
        return HttpResponse("not this workspace", status=403)
    if kind == "block_actions":
        return _button(payload, slack_user)
    if kind == "view_submission":
        return _submitted(payload, slack_user)
    return HttpResponse(status=200)  # other interactions are not ours: acknowledged, ignored


_home: dict[tuple[str, str], str] = {}


def home_workspace() -> str:
    """The workspace whose people may decide: SLACK_TEAM_ID, else the bot token's own (Slack's
    auth.test, asked once per process)."""
    if settings.SLACK_TEAM_ID:
        return str(settings.SLACK_TEAM_ID)
    key = (settings.SLACK_BOT_TOKEN, settings.SLACK_API_URL)
    if key not in _home:
        try:
            _home[key] = str(slack.client().auth_test()["team_id"])
        except (SlackApiError, SlackClientError, OSError, KeyError) as exc:
            logger.warning("Slack auth.test failed, so no workspace is trusted yet: %s", exc)
            return ""
    return _home[key]


def person(slack_user: str) -> Any:
    """The active user a Slack user is, or Refused saying why not."""
    prefs = (
        Preferences.objects.select_related("user")
        .filter(slack_user_id=slack_user, user__is_active=True)
        .first()
    )
    if prefs is not None:
        return prefs.user
    try:
        info = slack.client().users_info(user=slack_user)["user"]
    except (SlackApiError, SlackClientError, OSError) as exc:
        logger.warning("Slack users.info for %s failed: %s", slack_user, exc)
        raise Refused("Slack could not tell me who you are; try again, or decide in the dashboard.") from None
    if info.get("deleted") or info.get("is_restricted") or info.get("is_ultra_restricted"):
        raise Refused("Guests and deactivated Slack accounts cannot decide here; use the dashboard.")
    if info.get("team_id") != home_workspace():
        raise Refused("Your Slack account is of another workspace; use the dashboard.")
    email = (info.get("profile") or {}).get("email") or ""
    if not email or info.get("is_email_confirmed") is not True:
        raise Refused("Your Slack account has no confirmed mail address, so I cannot tell who you are here.")
    matches = list(User.objects.filter(email__iexact=email, is_active=True)[:2])
    if len(matches) != 1:
        raise Refused(
            f"No one (or more than one) in {settings.SITE_NAME} has the address {email}; "
            "ask an admin to link your Slack account to your user."
        )
    return matches[0]


def _interrupt(value: Any) -> Interrupt:
    try:
        return Interrupt.objects.select_related("run", "team").get(pk=int(value))
    except (ValueError, TypeError, Interrupt.DoesNotExist):
        raise Refused("That approval no longer exists.") from None


def _check(user: Any, interrupt: Interrupt, approving: bool) -> None:
    if not interrupt.is_pending:
        raise Refused(slack.verdict(interrupt).replace("*", "") + ": there is nothing left to decide.")
    if not engine.may_decide(user, interrupt):
        raise Refused(f"You may not decide this: {engine.why_not(user, interrupt)}")
    if approving and (rule := engine.separation_of_duties(user, interrupt)):
        raise Refused(rule)


def _tell(payload: dict[str, Any], slack_user: str, text: str) -> None:
    channel = (payload.get("channel") or {}).get("id") or slack_user
    try:
        slack.client().chat_postEphemeral(channel=channel, user=slack_user, text=text)
    except (SlackApiError, SlackClientError, OSError) as exc:
        logger.warning("could not tell Slack user %s: %s (%s)", slack_user, text, exc)


def _button(payload: dict[str, Any], slack_user: str) -> HttpResponse:
    action: dict[str, Any] = next(iter(payload.get("actions") or []), {})
    action_id = action.get("action_id")
    if action_id not in (slack.APPROVE, slack.REJECT):
        return HttpResponse(status=200)  # Open is a link; nothing to do
    try:
        user = person(slack_user)
        interrupt = _interrupt(action.get("value"))
        approving = action_id == slack.APPROVE
        _check(user, interrupt, approving)
        form = answer_form(interrupt) if approving else RejectForm(prefix="reject")
        if approving and isinstance(form, ApprovalForm):
            _decide(user, interrupt, approving, {"answer-comment": ""})
            return HttpResponse(status=200)
        slack.client().views_open(
            trigger_id=payload.get("trigger_id", ""), view=modal(interrupt, form, approving)
        )
    except Refused as exc:
        _tell(payload, slack_user, str(exc))
    except (SlackApiError, SlackClientError, OSError) as exc:
        logger.warning("Slack interaction failed: %s", exc)
    return HttpResponse(status=200)


def modal(interrupt: Interrupt, form: forms.Form, approving: bool) -> dict[str, Any]:
    """The form (the answer model's, or the reason to reject) as a Slack modal."""
    inputs = []
    for bound in form:
        field = bound.field
        # Filled in as the dashboard's form is (a default, an argument proposed to edit; the
        # field's own rendering of it, JSON as text): what a reviewer leaves alone is submitted
        # as it was, never as empty or unticked.
        value = bound.value()
        element: dict[str, Any]
        if isinstance(field, forms.BooleanField):
            option = _option("on", str(bound.label or bound.name))
            element = {
                "type": "checkboxes",
                "options": [option],
                **({"initial_options": [option]} if value else {}),
            }
        elif isinstance(field, forms.ChoiceField):
            choices: list[tuple[Any, Any]] = list(field.choices)  # type: ignore[arg-type]
            options = [_option(str(key), str(label)) for key, label in choices if key != ""][:100]
            element = {"type": "static_select", "options": options}
            if chosen := next((o for o in options if value is not None and o["value"] == str(value)), None):
                element["initial_option"] = chosen
        else:
            element = {"type": "plain_text_input", "multiline": isinstance(field.widget, forms.Textarea)}
            if value not in (None, ""):
                element["initial_value"] = str(value)[:3000]
        inputs.append(
            {
                "type": "input",
                "block_id": bound.html_name,
                "optional": not field.required,
                "label": {"type": "plain_text", "text": str(bound.label or bound.name)[:2000]},
                "element": {**element, "action_id": "value"},
                **(
                    {"hint": {"type": "plain_text", "text": html.unescape(str(field.help_text))[:2000]}}
                    if field.help_text
                    else {}
                ),
            }
        )
    verb = "Approve" if approving else "Reject"
    return {
        "type": "modal",
        "callback_id": "grundlag_decide",
        "private_metadata": json.dumps({"interrupt": interrupt.pk, "approve": approving}),
        "title": {"type": "plain_text", "text": verb},
        "submit": {"type": "plain_text", "text": verb},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*{slack.escape(interrupt.message)[:2900]}*"},
            },
            *inputs,
        ],
    }


def _option(value: str, text: str) -> dict[str, Any]:
    return {"value": value[:150], "text": {"type": "plain_text", "text": text[:75]}}


def _values(state: dict[str, Any]) -> dict[str, Any]:
    """A modal's state as the form's data (its fields' html names)."""
    data: dict[str, Any] = {}
    for block_id, actions in (state.get("values") or {}).items():
        element = (actions or {}).get("value") or {}
        kind = element.get("type")
        if kind == "checkboxes":
            if element.get("selected_options"):
                data[block_id] = "on"
        elif kind == "static_select":
            data[block_id] = (element.get("selected_option") or {}).get("value") or ""
        else:
            data[block_id] = element.get("value") or ""
    return data


def _submitted(payload: dict[str, Any], slack_user: str) -> HttpResponse:
    view = payload.get("view") or {}
    if view.get("callback_id") != "grundlag_decide":
        return HttpResponse(status=200)
    blocks = [b.get("block_id") for b in view.get("blocks", []) if b.get("type") == "input"]
    first = blocks[0] if blocks else "reject-reason"
    try:
        meta = json.loads(view.get("private_metadata") or "{}")
        user = person(slack_user)
        interrupt = _interrupt(meta.get("interrupt"))
        approving = bool(meta.get("approve"))
        _check(user, interrupt, approving)
        return _decide(user, interrupt, approving, _values(view.get("state") or {}))
    except Refused as exc:
        return JsonResponse({"response_action": "errors", "errors": {first: str(exc)}})
    except ValueError:
        return HttpResponse("bad private_metadata", status=400)


def _decide(user: Any, interrupt: Interrupt, approving: bool, data: dict[str, Any]) -> HttpResponse:
    """Decide through the engine; the modal's field errors, or an empty 200 (the modal closes,
    and the message is updated by the decided notification)."""
    form: SchemaForm | ApprovalForm | RejectForm = (
        answer_form(interrupt, data) if approving else RejectForm(data, prefix="reject")
    )
    if not form.is_valid():
        return _errors(form)
    try:
        if approving:
            assert not isinstance(form, RejectForm)
            engine.resume(interrupt, form.payload(), user, via="slack")
        else:
            engine.reject(interrupt, form.cleaned_data["reason"], user, via="slack")
    except engine.InvalidInput as exc:
        if isinstance(form, RejectForm):
            form.add_error("reason", str(exc))
        else:
            form.add_model_errors(exc.errors)
        return _errors(form)
    except engine.AlreadyDecided as exc:
        raise Refused(slack.verdict(exc.interrupt).replace("*", "") + ": it was decided first.") from None
    except (engine.NotAllowed, engine.PayloadTooLarge, engine.Busy) as exc:
        raise Refused(str(exc)) from None
    return HttpResponse(status=200)


def _errors(form: forms.Form) -> JsonResponse:
    names = [bound.html_name for bound in form]
    errors = {}
    for name, messages in form.errors.items():
        target = form.add_prefix(name) if name != NON_FIELD_ERRORS else (names[0] if names else "")
        errors[target] = " ".join(str(m) for m in messages)
    return JsonResponse({"response_action": "errors", "errors": errors})
