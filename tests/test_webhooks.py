"""Webhooks, in-process against a real HTTP receiver on 127.0.0.1 that verifies every request
with the `standardwebhooks` package, as a calling application would."""

from __future__ import annotations

import json
import logging
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from actions import engine, notify
from actions.models import DeliveryAttempt, Interrupt, Notification, Run, RunEvent, Team, Webhook
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps")]


def post(client: Client, key: str, path: str, body: Any) -> Any:
    auth = {"Authorization": f"Bearer {key}"}
    return client.post(f"/api{path}", json.dumps(body), content_type="application/json", headers=auth)


def registered(client: Client, key: str, url: str, events: list[str] | None = None) -> dict[str, Any]:
    events = events or ["interrupt.created", "interrupt.decided", "run.finished"]
    response = post(client, key, "/webhooks", {"url": url, "events": events})
    assert response.status_code == 201, response.content
    return dict(response.json())


# The API


def test_a_webhook_is_registered_listed_and_deleted_in_the_tokens_team_only(
    client: Client, token_key: str, other_token_key: str, receiver: Receiver
) -> None:
    hook = registered(client, token_key, receiver.url)
    assert hook["secret"].startswith("whsec_") and hook["events"] == sorted(hook["events"])
    auth = {"Authorization": f"Bearer {token_key}"}
    listed = client.get("/api/webhooks", headers=auth).json()
    assert [h["id"] for h in listed] == [hook["id"]]
    assert "secret" not in listed[0], "the secret is shown once, when it is made"
    other = {"Authorization": f"Bearer {other_token_key}"}
    assert client.get("/api/webhooks", headers=other).json() == []
    assert client.delete(f"/api/webhooks/{hook['id']}", headers=other).status_code == 404
    assert client.delete(f"/api/webhooks/{hook['id']}", headers=auth).status_code == 204
    assert client.get("/api/webhooks", headers=auth).json() == []


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:9/hook", "resolves to a private, loopback or link-local address"),
        ("http://169.254.169.254/latest/meta-data", "resolves to a private"),
        ("http://10.1.2.3/hook", "resolves to a private"),
        ("http://[::1]/hook", "resolves to a private"),
        ("http://[::ffff:127.0.0.1]/hook", "resolves to a private"),
        ("http://[64:ff9b::a00:5]/hook", "resolves to a private"),
        ("http://0.0.0.0/hook", "resolves to a private"),
        ("http://2130706433/hook", "resolves to a private"),
        ("http://localhost/hook", "a private, loopback or link-local address"),
        ("http://straße.example/hook", "the host must be ASCII"),
        ("ftp://example.com/hook", "must be http:// or https://"),
        ("https://user:pw@example.com/hook", "must not carry credentials"),
    ],
)
def test_an_endpoint_in_a_private_network_or_of_another_scheme_is_refused(
    client: Client, token_key: str, url: str, problem: str
) -> None:
    response = post(client, token_key, "/webhooks", {"url": url, "events": ["run.finished"]})
    assert response.status_code == 422 and problem in response.json()["detail"], response.content
    assert not Webhook.objects.exists()


def test_a_team_has_at_most_ten_webhooks(client: Client, token_key: str, receiver: Receiver) -> None:
    for n in range(10):
        registered(client, token_key, f"{receiver.url}/{n}")
    response = post(client, token_key, "/webhooks", {"url": receiver.url, "events": ["run.finished"]})
    assert response.status_code == 422 and "at most 10 webhooks" in response.json()["detail"]
    assert Webhook.objects.count() == 10


def test_an_event_that_cannot_be_told_does_not_hold_up_the_ones_after_it(
    client: Client,
    token_key: str,
    team: Team,
    reviewer: User,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    dispatch = importlib.import_module("actions.notify.dispatch")  # the module, not the function
    registered(client, token_key, receiver.url, ["interrupt.created"])
    bad = engine.start_run("send_invoice", {"invoice_id": "W-9", "amount": 5.0}, team, reviewer)
    describe = dispatch.interrupt_data

    def broken_for_the_first(it: Interrupt) -> dict[str, Any]:
        if it.run_id == bad.pk:
            raise RuntimeError("a bug in describing it")
        return dict(describe(it))

    monkeypatch.setattr(dispatch, "interrupt_data", broken_for_the_first)
    engine.start_run("send_invoice", {"invoice_id": "W-10", "amount": 5.0}, team, reviewer)
    assert notify.dispatch() == 1
    assert notify.dispatch() == 0, "the bad event is not tried again every round"
    assert len(receiver.received) == 1


def test_an_unknown_event_type_is_refused(client: Client, token_key: str, receiver: Receiver) -> None:
    response = post(client, token_key, "/webhooks", {"url": receiver.url, "events": ["interrupt.eaten"]})
    assert response.status_code == 422
    assert not Webhook.objects.exists()


# Delivery


def test_each_event_reaches_the_endpoint_once_signed_and_without_the_checkpoint(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    hook = registered(client, token_key, receiver.url)
    run = engine.start_run("send_invoice", {"invoice_id": "W-1", "amount": 5.0}, team, reviewer)
    assert notify.dispatch() == 1
    assert notify.dispatch() == 0, "an event is fanned out once"
    (interrupt,) = engine.pending_interrupts(run.pk)
    Interrupt.objects.filter(pk=interrupt.pk).update(state={"secret_step": "checkpoint-xyz"})
    engine.resume(interrupt, {"approved": True}, reviewer)
    assert notify.dispatch() == 2  # decided, then the run finished

    bodies = receiver.verified(hook["secret"])
    assert [body["type"] for body in bodies] == ["interrupt.created", "interrupt.decided", "run.finished"]
    created = bodies[0]["data"]
    assert created["id"] == interrupt.pk and created["run_id"] == run.pk and created["status"] == "pending"
    assert created["url"].endswith(f"/interrupts/{interrupt.pk}/")
    assert bodies[1]["data"]["decided_by"] == reviewer.username
    assert bodies[2]["data"]["status"] == "completed"
    assert all(b"checkpoint-xyz" not in body and b'"state"' not in body for _, body in receiver.received)
    ids = [headers["webhook-id"] for headers, _ in receiver.received]
    assert len(set(ids)) == 3
    assert Notification.objects.filter(outcome="delivered").count() == 3
    assert DeliveryAttempt.objects.filter(ok=True, status_code=200).count() == 3


def test_a_change_that_rolls_back_tells_nobody(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    registered(client, token_key, receiver.url)

    class Abandoned(Exception):
        pass

    with pytest.raises(Abandoned), transaction.atomic():
        engine.start_run("send_invoice", {"invoice_id": "W-2", "amount": 5.0}, team, reviewer)
        raise Abandoned
    assert notify.dispatch() == 0
    assert receiver.received == [] and not Notification.objects.exists()


def test_a_failed_delivery_is_retried_with_backoff_under_the_same_id(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    hook = registered(client, token_key, receiver.url, ["interrupt.created"])
    receiver.codes = [500]
    engine.start_run("send_invoice", {"invoice_id": "W-3", "amount": 5.0}, team, reviewer)
    began = timezone.now()
    notify.dispatch()
    notification = Notification.objects.get()
    assert notification.outcome == "pending" and notification.attempts == 1
    assert timedelta(seconds=9) < notification.next_attempt_at - began < timedelta(seconds=12)
    (attempt,) = notification.delivery_attempts.all()
    assert (attempt.ok, attempt.status_code, attempt.error) == (False, 500, "HTTP 500 Internal Server Error")
    assert Webhook.objects.get().failing_since is not None

    assert notify.deliver_due() == 0, "not due yet"
    Notification.objects.update(next_attempt_at=timezone.now())
    assert notify.deliver_due() == 1
    notification.refresh_from_db()
    assert notification.outcome == "delivered" and notification.attempts == 2
    assert Webhook.objects.get().failing_since is None
    first, second = receiver.received
    assert first[0]["webhook-id"] == second[0]["webhook-id"] == notification.message_id
    assert len(receiver.verified(hook["secret"])) == 2


def test_a_rejected_run_is_told_as_finished_and_a_cancel_tells_each_approval_it_ends(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    """A service waiting on the webhook for its approval never heard a rejection; cancelling
    told no one of the approvals it ended (issue 36)."""
    hook = registered(client, token_key, receiver.url, ["interrupt.decided", "run.finished"])

    def told() -> list[tuple[str, int, str]]:
        notify.dispatch()
        bodies = receiver.verified(hook["secret"])
        receiver.received.clear()
        return sorted((b["type"], b["data"]["id"], b["data"]["status"]) for b in bodies)

    rejected = engine.start_run("send_invoice", {"invoice_id": "W-R", "amount": 5.0}, team, reviewer)
    (asked,) = engine.pending_interrupts(rejected.pk)
    engine.reject(asked, "not this month", reviewer)
    assert told() == [("interrupt.decided", asked.pk, "rejected"), ("run.finished", rejected.pk, "rejected")]

    cancelled = engine.start_run("send_invoice", {"invoice_id": "W-C", "amount": 5.0}, team, reviewer)
    (ended,) = engine.pending_interrupts(cancelled.pk)
    engine.cancel(cancelled, reviewer)
    assert told() == [
        ("interrupt.decided", ended.pk, "cancelled"),
        ("run.finished", cancelled.pk, "cancelled"),
    ]


@pytest.mark.django_db(transaction=True)  # a delivery on another thread, with its own connection
def test_an_endpoint_deleted_while_a_delivery_to_it_is_under_way_takes_the_delivery_with_it(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver, caplog: Any
) -> None:
    """Deleting a webhook deletes its notifications; one being sent then recorded its attempt
    against a row that was gone: IntegrityError (issue 36)."""
    registered(client, token_key, receiver.url, ["interrupt.created"])

    def delete_the_webhook() -> None:  # from the endpoint's thread, as a team admin would meanwhile
        try:
            assert Webhook.objects.all().delete()[0] >= 2  # the webhook and its notification
        finally:
            connection.close()

    receiver.during = [delete_the_webhook]
    engine.start_run("send_invoice", {"invoice_id": "W-9", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    assert len(receiver.received) == 1 and not receiver.during
    assert not Webhook.objects.exists() and not Notification.objects.exists()
    assert not DeliveryAttempt.objects.exists()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_an_endpoint_failing_for_a_day_is_disabled_saying_why_and_gets_nothing_more(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    registered(client, token_key, receiver.url, ["interrupt.created"])
    Webhook.objects.update(failing_since=timezone.now() - timedelta(days=1, minutes=1))
    receiver.codes = [503]
    engine.start_run("send_invoice", {"invoice_id": "W-4", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    hook = Webhook.objects.get()
    assert hook.disabled_at is not None and "HTTP 503" in hook.disabled_reason
    listed = client.get("/api/webhooks", headers={"Authorization": f"Bearer {token_key}"}).json()
    assert listed[0]["disabled_at"] is not None and "HTTP 503" in listed[0]["disabled_reason"]

    engine.start_run("send_invoice", {"invoice_id": "W-5", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    assert Notification.objects.count() == 1 and len(receiver.received) == 1

    # The team sees it in its inbox; another team does not.
    client.force_login(reviewer)
    warning = client.get("/").content.decode()
    assert "A webhook of Finance is disabled and hears of nothing" in warning and "HTTP 503" in warning
    client.force_login(User.objects.create_user("payroll-reviewer"))
    assert "is disabled" not in client.get("/").content.decode()


def test_an_approval_counted_toward_several_decides_nothing_yet(
    client: Client, token_key: str, team: Team, reviewer: User, second_reviewer: User, receiver: Receiver
) -> None:
    from actions.models import Policy

    Policy.objects.create(team=team, action="send_invoice", approvals_required=2)
    registered(client, token_key, receiver.url, ["interrupt.decided"])
    run = engine.start_run("send_invoice", {"invoice_id": "W-6", "amount": 5.0}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, reviewer)
    assert notify.dispatch() == 0
    engine.resume(Interrupt.objects.get(pk=interrupt.pk), {"approved": True}, second_reviewer)
    assert notify.dispatch() == 1
    assert RunEvent.objects.filter(kind="approved").count() == 2


def test_redelivering_sends_a_delivered_notification_again_now(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    registered(client, token_key, receiver.url, ["interrupt.created"])
    engine.start_run("send_invoice", {"invoice_id": "W-7", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    with transaction.atomic():
        assert notify.redeliver(list(Notification.objects.values_list("pk", flat=True))) == 1
    assert len(receiver.received) == 2
    assert Notification.objects.get().outcome == "delivered"


def test_a_run_stays_intact_when_its_endpoint_is_down(
    client: Client, token_key: str, team: Team, reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True
    registered(client, token_key, "http://127.0.0.1:9/nobody-listens", ["interrupt.created"])
    run = engine.start_run("send_invoice", {"invoice_id": "W-8", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    (attempt,) = DeliveryAttempt.objects.all()
    assert not attempt.ok and attempt.status_code is None and "ConnectError" in attempt.error
    assert Run.objects.get(pk=run.pk).status == "interrupted"


# The official Standard Webhooks library for node, as a TypeScript application checks a delivery.

NODE_VERIFIER = Path(__file__).parent / "node" / "verify_webhook.mjs"


def node_verified(secret: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
    """What tests/node/verify_webhook.mjs (the `standardwebhooks` npm package) makes of a
    delivery: its exit status and the payload it verified, or its error."""
    given = {"secret": secret, "headers": headers, "body": body.decode()}
    done = subprocess.run(
        ["node", str(NODE_VERIFIER)], input=json.dumps(given), capture_output=True, text=True, timeout=60
    )
    return done.returncode, json.loads(done.stdout or json.dumps({"error": done.stderr}))


def test_deliveries_verify_with_the_standard_webhooks_node_library(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    hook = registered(client, token_key, receiver.url)
    run = engine.start_run("send_invoice", {"invoice_id": "W-N", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, reviewer)
    notify.dispatch()
    assert len(receiver.received) == 3
    for headers, body in receiver.received:
        code, payload = node_verified(hook["secret"], headers, body)
        assert code == 0, payload
        assert payload == json.loads(body)
    headers, body = receiver.received[0]
    forged = body.replace(b'"pending"', b'"approved"')
    assert forged != body
    code, said = node_verified(hook["secret"], headers, forged)
    assert code == 1 and "signature" in said["error"].lower(), said
    other = registered(client, token_key, f"{receiver.url}/other")["secret"]
    assert node_verified(other, headers, body)[0] == 1  # another endpoint's secret
