"""Who may see and do what, and what bad input gets."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from pydantic import BaseModel

from actions import engine
from actions.core import ActionContext, ActionInterrupt, action
from actions.models import ApiToken, Interrupt, Run, RunEvent, Team
from actions.web.consumers import InboxConsumer

pytestmark = pytest.mark.django_db

MARKER = f"CKPT-{uuid.uuid4().hex}"


class ProbeInput(BaseModel):
    label: str


@action(input=ProbeInput, name="privacy_probe")
def privacy_probe(ctx: ActionContext) -> dict[str, Any]:
    """Pauses twice; only its checkpoints carry the marker."""
    if ctx.resumption is None:
        raise ActionInterrupt("First look?", {"label": ctx.input.label}, state={"secret": MARKER, "step": 1})
    if ctx.resumption.state["step"] == 1:
        raise ActionInterrupt("Second look?", {"label": ctx.input.label}, state={"secret": MARKER, "step": 2})
    return {"done": ctx.input.label}


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)  # served on another thread, with its own connection
def test_the_checkpoint_never_leaves_the_server(
    team: Team, reviewer: User, auditor: User, token_key: str
) -> None:
    admin = User.objects.create_superuser("root", password="pw-root")
    api_headers = {"Authorization": f"Bearer {token_key}"}
    api = Client()
    frames: list[str] = []

    async def listen_while(work: Any) -> None:
        communicator = WebsocketCommunicator(InboxConsumer.as_asgi(), "/ws/inbox/")
        communicator.scope["user"] = reviewer
        await communicator.connect()
        from channels.db import database_sync_to_async

        await database_sync_to_async(work)()
        while not await communicator.receive_nothing(timeout=0.3):
            frames.append(json.dumps(await communicator.receive_output()))
        await communicator.disconnect()

    run_ids: list[int] = []

    def work() -> None:
        started = api.post(
            "/api/runs",
            json.dumps({"action": "privacy_probe", "input": {"label": "p"}}),
            content_type="application/json",
            headers={**api_headers, "Prefer": "wait=5"},
        ).json()
        run_ids.append(started["id"])
        first = Interrupt.objects.get(run=started["id"], seq=1)
        logged_in(reviewer).post(
            f"/interrupts/{first.pk}/approve/", {"answer-comment": "ok"}, headers={"HX-Request": "true"}
        )
        second = Interrupt.objects.get(run=started["id"], seq=2)  # left pending: its state is live
        assert second.state == {"secret": MARKER, "step": 2}

    from asgiref.sync import async_to_sync

    async_to_sync(listen_while)(work)
    run_id = run_ids[0]
    interrupts = list(Interrupt.objects.filter(run=run_id))
    bodies: dict[str, bytes] = {}

    def fetch(client: Client, url: str, **headers: str) -> None:
        response = client.get(url, headers=headers)
        assert response.status_code in (200, 204), (url, response.status_code)
        bodies[url + repr(headers)] = response.content

    for client in (logged_in(reviewer), logged_in(auditor)):
        for url in ("/", "/runs/", f"/runs/{run_id}/", "/start/", "/start/privacy_probe/"):
            fetch(client, url)
            fetch(client, url, **{"HX-Request": "true"})
        for it in interrupts:
            fetch(client, f"/interrupts/{it.pk}/")
            fetch(client, f"/interrupts/{it.pk}/?panel=1&known=approved", **{"HX-Request": "true"})
    for url in ("/api/actions", f"/api/runs/{run_id}", "/api/interrupts", "/api/interrupts?status=pending"):
        fetch(api, url, Authorization=f"Bearer {token_key}")
    fetch(api, "/api/openapi.json")
    fetch(api, "/api/docs")
    root = logged_in(admin)
    for url in (
        "/admin/",
        "/admin/actions/interrupt/",
        "/admin/actions/run/",
        "/admin/actions/runevent/",
        f"/admin/actions/run/{run_id}/change/",
        *(f"/admin/actions/interrupt/{it.pk}/change/" for it in interrupts),
    ):
        fetch(root, url)

    leaks = [where for where, body in bodies.items() if MARKER.encode() in body]
    assert leaks == [], f"the checkpoint leaked in {leaks}"
    assert frames and not [f for f in frames if MARKER in f]
    # The pending interrupt's state is still there for the action: the scan looked at live data.
    second_state = Interrupt.objects.get(run=run_id, seq=2).state
    assert isinstance(second_state, dict) and second_state["secret"] == MARKER


def test_only_superusers_see_a_checkpoint_and_each_view_is_logged(team: Team, auditor: User) -> None:
    run = engine.start_run("privacy_probe", {"label": "x"}, team, None)
    interrupt = run.interrupts.get()
    url = f"/admin/actions/interrupt/{interrupt.pk}/checkpoint/"
    auditor.is_superuser = False
    auditor.save()
    assert logged_in(auditor).get(url).status_code in (302, 403, 404)
    admin = User.objects.create_superuser("root", password="pw-root")
    page = logged_in(admin).get(url)
    assert page.status_code == 200 and MARKER in page.content.decode()
    event = RunEvent.objects.get(run=run, kind="checkpoint_viewed")
    assert (event.actor_name, event.interrupt_id) == ("root", interrupt.pk)


def test_forms_need_a_csrf_token(team: Team, reviewer: User) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "A", "amount": 1}, team, None)
    interrupt = run.interrupts.get()
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    assert client.post(f"/interrupts/{interrupt.pk}/approve/", {}).status_code == 403
    assert (
        client.post(f"/interrupts/{interrupt.pk}/approve/", {}, headers={"HX-Request": "true"}).status_code
        == 403
    )
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"
    page = client.get(f"/interrupts/{interrupt.pk}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    assert '"X-CSRFToken": "' in page, "htmx requests send the token from <body hx-headers>"
    ok = client.post(f"/interrupts/{interrupt.pk}/approve/", {"csrfmiddlewaretoken": token.group(1)})
    assert ok.status_code == 302


def test_tokens_are_listed_and_revoked_by_management_command(team: Team, capsys: Any) -> None:
    token, key = ApiToken.issue(team, "deploy-bot")
    call_command("api_tokens", "list")
    listing = capsys.readouterr().out
    assert "deploy-bot" in listing and token.prefix in listing and key not in listing
    call_command("api_tokens", "revoke", key[:10])
    assert engine.authenticate(key) is None
    assert Client().get("/api/actions", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_oversized_and_deeply_nested_payloads_are_refused_naming_the_limit(
    team: Team, token_key: str, settings: Any
) -> None:
    headers = {"Authorization": f"Bearer {token_key}"}
    client = Client()
    big = json.dumps({"action": "send_invoice", "input": {"invoice_id": "x" * 300_000, "amount": 1}})
    response = client.post("/api/runs", big, content_type="application/json", headers=headers)
    assert response.status_code == 413
    assert re.match(
        r"the (request body|input) is \d+ bytes; the limit is \d+ bytes", response.json()["detail"]
    )

    settings.GRUNDLAG_MAX_PAYLOAD_BYTES = 2048
    medium = json.dumps({"action": "send_invoice", "input": {"invoice_id": "x" * 3000, "amount": 1}})
    response = client.post("/api/runs", medium, content_type="application/json", headers=headers)
    assert response.status_code == 413 and response.json()["detail"].endswith("the limit is 2048 bytes")

    deep: Any = "bottom"
    for _ in range(200):
        deep = [deep]
    run = engine.start_run("send_invoice", {"invoice_id": "A", "amount": 1}, team, None)
    url = f"/api/interrupts/{run.interrupts.get().pk}/resume"
    response = client.post(url, json.dumps({"data": deep}), content_type="application/json", headers=headers)
    assert response.status_code == 422 and "nested deeper than 32 levels" in json.dumps(response.json())
    absurd = '{"action": "send_invoice", "input": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = client.post("/api/runs", absurd, content_type="application/json", headers=headers)
    assert response.status_code in (400, 413, 422) and "detail" in response.json()
    assert Run.objects.count() == 1 and run.interrupts.get().status == "pending"


@pytest.mark.parametrize("final", ["expired", "cancelled", "rejected"])
def test_answers_to_closed_interrupts_are_refused_and_change_nothing(
    final: str, team: Team, reviewer: User, token_key: str
) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "A", "amount": 1}, team, None)
    Interrupt.objects.filter(run=run).update(status=final)
    interrupt = run.interrupts.get()
    response = Client().post(
        f"/api/interrupts/{interrupt.pk}/resume",
        json.dumps({"data": {"approved": True}}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token_key}"},
    )
    assert response.status_code == 409 and final in response.json()["detail"]
    page = logged_in(reviewer).post(f"/interrupts/{interrupt.pk}/approve/", {})
    assert page.status_code == 409
    run.refresh_from_db()
    assert run.status == "interrupted" and "approved" not in run.events.values_list("kind", flat=True)


PRIVATE_LOOKUPS = [
    "state__isnull",
    "state__first_answer__comment__startswith",
    "state__secret__startswith",
    "driver_state__source__contains",
    "interrupt__state__secret__startswith",
    "run__driver_state__source__contains",
    "interrupts__state__secret__startswith",
    "run__interrupts__state__secret__startswith",
    "key_hash__startswith",
    "tokens__key_hash__startswith",
    "password__startswith",
]


def test_no_admin_changelist_filters_by_a_private_field(
    admin_client: Client, team: Team, reviewer: User
) -> None:
    """A staff user could read a checkpoint (a PIN) one character at a time by filtering on it."""
    from django.contrib import admin

    run = engine.start_run("privacy_probe", {"label": "pin"}, team, None, Run.Consumer.API)
    assert run.interrupts.get().state["secret"] == MARKER
    ApiToken.issue(team, "ci")
    checked = 0
    for model in admin.site._registry:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for lookup in PRIVATE_LOOKUPS:
            value = "1" if lookup.endswith("isnull") else MARKER[:6]
            response = admin_client.get(url, {lookup: value})
            # Refused (400), or an unknown lookup (302 to ?e=1): never a filtered list.
            assert response.status_code in (400, 302), (url, lookup, response.status_code)
            checked += 1
    assert checked >= 6 * len(PRIVATE_LOOKUPS)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/runs", '{"action": "send_invoice", "input": {"invoice_id": "A", "amount": NaN}}', "amount"),
        (
            "/api/runs",
            '{"action": "send_invoice", "input": {"invoice_id": "A", "amount": Infinity}}',
            "amount",
        ),
        ("/api/scripts/runs", '{"source": "return 1", "input": {"x": [1, -Infinity]}}', "input"),
        (
            "/api/agents/runs",
            '{"messages": [{"role": "user", "content": "hi", "tool_calls": [{"n": NaN}]}],'
            ' "tools": [], "model": {"scripted": []}}',
            "messages",
        ),
    ],
)
def test_nan_and_infinity_are_422_naming_the_field_and_store_nothing(
    client: Client, token_key: str, path: str, body: str, field: str
) -> None:
    response = client.post(
        path, body, content_type="application/json", headers={"Authorization": f"Bearer {token_key}"}
    )
    assert response.status_code == 422, response.content
    errors = response.json()["detail"]
    assert errors[0]["loc"][0] == field and "NaN and Infinity" in errors[0]["msg"]
    assert not Run.objects.exists()


def test_an_answer_with_nan_is_422_and_the_interrupt_stays_pending(
    client: Client, team: Team, token_key: str
) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "A", "amount": 1}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    response = client.post(
        f"/api/interrupts/{interrupt.pk}/resume",
        '{"data": {"approved": true, "score": NaN}}',
        content_type="application/json",
        headers={"Authorization": f"Bearer {token_key}"},
    )
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["score"]
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"


@pytest.mark.parametrize(
    "query",
    [
        {"since": "2024-02-30"},
        {"until": "2023-13-01"},
        {"after": "2024-02-30T10:00:00|5"},
        {"after": "2024-01-01T10:00:00|" + "9" * 40},
        {"after": "2024-01-01T10:00:00|²"},
        {"after": "not-a-date|x"},
    ],
)
def test_impossible_dates_and_cursors_in_the_history_are_ignored_not_500(
    auditor: User, client: Client, query: dict[str, str]
) -> None:
    client.force_login(auditor)
    assert client.get("/history/", query).status_code == 200
    assert client.get("/history/export.csv", query).status_code == 200


def test_pages_carry_a_content_security_policy_and_the_security_headers(
    reviewer: User, client: Client
) -> None:
    client.force_login(reviewer)
    for path in ("/", "/runs/", "/login/", "/start/"):
        response = client.get(path)
        policy = dict(
            part.strip().split(" ", 1)
            for part in response["Content-Security-Policy"].split(";")
            if part.strip()
        )
        assert policy["script-src"] == "'self'", "scripts from this site's own files only"
        assert "unsafe-eval" not in response["Content-Security-Policy"]
        assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
        assert response["X-Frame-Options"] == "DENY"
        assert response["X-Content-Type-Options"] == "nosniff"
        assert response["Referrer-Policy"] == "same-origin"
        page = response.content.decode()
        # Nothing the policy would block: no inline script, no inline handler, no eval'd filter.
        assert not re.search(r"<script(?![^>]*\bsrc=)", page)
        assert not re.search(r"\son[a-z]+=", page) and "hx-on" not in page
        assert not re.search(r'hx-trigger="[^"]*\[', page)
        assert '"allowEval": false' in page
