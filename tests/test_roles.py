"""Roles per team membership: a viewer sees the inbox and comments, an approver also decides, an
admin also changes the team's members, an auditor reads the history and never decides. Checked
where each thing is done (the engine's decision contract, the pages, the mail links, the
notifications, grants and delegation), and changed on the Team page and by manage.py."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from actions import engine, notify
from actions.drivers.approval import request_approval
from actions.models import Grant, Interrupt, Membership, Notification, Preferences, Role, Run, Team

# On SQLite and on PostgreSQL: what each role may is asked of the database.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database")]


def in_role(team: Team, username: str, role: str) -> User:
    user = User.objects.create_user(username, password=f"pw-{username}", email=f"{username}@example.com")
    Membership.objects.create(team=team, user=user, role=role)
    return user


def start(team: Team, n: int = 5, by: User | None = None) -> Interrupt:
    run = engine.start_run(
        "send_invoice", {"invoice_id": f"INV-{n}", "amount": 50}, team, by, Run.Consumer.API
    )
    return run.interrupts.get()


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_members_added_without_a_role_are_approvers_as_every_member_was_before_roles(team: Team) -> None:
    user = User.objects.create_user("old")
    team.members.add(user)  # as every caller did before roles
    assert Membership.objects.get(team=team, user=user).role == Role.APPROVER
    assert engine.may_decide(user, start(team))


def test_a_viewer_sees_the_inbox_and_comments_but_cannot_decide_and_is_told_which_role_would(
    team: Team,
) -> None:
    viewer = in_role(team, "vera", Role.VIEWER)
    it = start(team)
    client = logged_in(viewer)
    assert "INV-5" in client.get("/").content.decode()
    page = client.get(f"/interrupts/{it.pk}/").content.decode()
    assert "you need the approver role in this team; yours is viewer" in page
    refused = client.post(f"/interrupts/{it.pk}/approve/", {})
    assert refused.status_code == 403
    assert "you need the approver role in this team; yours is viewer" in refused.content.decode()
    with pytest.raises(engine.NotAllowed, match="approver role"):
        engine.resume(it, {"approved": True}, viewer)
    # Nor as a whole: a bulk approval refuses it, naming why; cancelling the run is a decision too.
    bulk = client.post("/bulk/", {"verb": "approve", "ids": [str(it.pk)]}).content.decode()
    assert "you need the approver role" in bulk
    assert Interrupt.objects.get(pk=it.pk).status == Interrupt.Status.PENDING
    with pytest.raises(engine.NotAllowed, match="To cancel a run you need the approver role"):
        engine.cancel(it.run, viewer)
    assert client.post(f"/interrupts/{it.pk}/comments/", {"body": "why so much?"}).status_code == 302
    with pytest.raises(engine.NotAllowed, match="To start a run you need the approver role"):
        start(team, 6, viewer)
    # An approver of the same team decides it.
    engine.resume(it, {"approved": True}, in_role(team, "apu", Role.APPROVER))
    assert Interrupt.objects.get(pk=it.pk).status == Interrupt.Status.APPROVED


def test_an_auditor_reads_the_history_and_the_run_but_has_no_inbox_and_never_decides_or_comments(
    team: Team, other_team: Team, reviewer: User
) -> None:
    auditor = in_role(team, "audrey", Role.AUDITOR)
    decided, pending = start(team, 1), start(team, 2)
    engine.resume(decided, {"approved": True}, reviewer)
    elsewhere = start(other_team, 3)
    engine.resume(elsewhere, {"approved": True}, None)
    client = logged_in(auditor)
    assert "INV-2" not in client.get("/").content.decode()  # the inbox is the team's workers'
    history = client.get("/history/")
    assert [it.pk for it in history.context["rows"]] == [decided.pk]  # only the teams they audit
    assert client.get("/history/", {"team": "payroll"}).status_code == 403
    export = b"".join(client.get("/history/export.jsonl").streaming_content).decode()  # type: ignore[attr-defined]
    assert [json.loads(line)["interrupt_id"] for line in export.splitlines()] == [decided.pk]
    assert client.get(f"/runs/{decided.run_id}/").status_code == 200
    assert client.get(f"/runs/{elsewhere.run_id}/").status_code == 404
    page = client.get(f"/interrupts/{pending.pk}/").content.decode()
    assert "yours is auditor" in page
    assert client.post(f"/interrupts/{pending.pk}/approve/", {}).status_code == 403
    refused = client.post(f"/interrupts/{pending.pk}/comments/", {"body": "noted"})
    assert (
        refused.status_code == 403 and "To discuss this you need the viewer role" in refused.content.decode()
    )
    with pytest.raises(engine.NotAllowed):
        engine.comment(pending, "noted", auditor)


def test_only_those_who_decide_are_asked_by_mail_and_a_demoted_one_is_not_sent_what_was_queued(
    team: Team, settings: Any
) -> None:
    settings.GRUNDLAG_BASE_URL = "http://testserver"
    approver = in_role(team, "apu", Role.APPROVER)
    admin = in_role(team, "ada", Role.ADMIN)
    in_role(team, "vera", Role.VIEWER)
    in_role(team, "audrey", Role.AUDITOR)
    mail.outbox.clear()
    start(team)
    notify.dispatch()
    assert sorted(address for message in mail.outbox for address in message.to) == [
        "ada@example.com",
        "apu@example.com",
    ]
    # Demoted between the fan-out and the delivery (a digest, sent later): not sent, and says why.
    Preferences.objects.create(user=approver, email_digest=True)
    mail.outbox.clear()
    start(team, 6)
    notify.dispatch()
    engine.members.set_role(team, approver, Role.VIEWER, admin)
    Notification.objects.filter(digest=True).update(next_attempt_at=timezone.now())
    while notify.deliver_due():
        pass
    assert [message.to for message in mail.outbox] == [["ada@example.com"]]
    reasons = Notification.objects.filter(recipient=approver, outcome="skipped").values_list(
        "delivery_attempts__error", flat=True
    )
    assert list(reasons) == ["not sent: the recipient's role (viewer) is not told of it"]


def test_a_grant_stops_approving_once_its_giver_no_longer_decides(team: Team) -> None:
    giver = in_role(team, "gina", Role.APPROVER)
    admin = in_role(team, "ada", Role.ADMIN)
    requester = in_role(team, "rex", Role.APPROVER)
    first = start(team, 7, requester)
    engine.approve(first, {"approved": True}, giver, grant=engine.GrantAsked("hour"))
    assert Grant.objects.filter(granted_by=giver).exists()
    assert start(team, 7, requester).status == Interrupt.Status.APPROVED  # the same again
    engine.members.set_role(team, giver, Role.VIEWER, admin)
    assert start(team, 7, requester).status == Interrupt.Status.PENDING  # not in a viewer's name


def test_assignees_and_delegates_must_be_people_who_decide(team: Team) -> None:
    approver = in_role(team, "apu", Role.APPROVER)
    viewer = in_role(team, "vera", Role.VIEWER)
    with pytest.raises(ValueError, match="vera is not an approver or admin in any team where you decide"):
        engine.set_away(approver, viewer, timezone.now(), timezone.now() + timedelta(days=1))
    with pytest.raises(engine.InvalidInput, match="who decide"):
        request_approval(team, None, message="Pay it?", assignees=["vera"])
    asked = request_approval(team, None, message="Pay it?", assignees=["apu"])
    assert Interrupt.objects.get(run=asked).assignees == ["apu"]


def test_team_admins_change_members_and_roles_on_the_team_page_and_others_may_not(team: Team) -> None:
    admin = in_role(team, "ada", Role.ADMIN)
    viewer = in_role(team, "vera", Role.VIEWER)
    newcomer = User.objects.create_user("nico")
    client = logged_in(admin)
    page = client.get("/teams/finance/").content.decode()
    assert "vera" in page and "Add a member" in page
    assert client.post("/teams/finance/members/", {"username": "nico", "role": "auditor"}).status_code == 302
    assert Membership.objects.get(team=team, user=newcomer).role == Role.AUDITOR
    assert client.post("/teams/finance/members/", {"username": "vera", "role": "approver"}).status_code == 302
    assert Membership.objects.get(team=team, user=viewer).role == Role.APPROVER
    bad = client.post("/teams/finance/members/", {"username": "vera", "role": "owner"})
    assert bad.status_code == 422 and "is not a role" in bad.content.decode()
    assert client.post("/teams/finance/members/", {"username": "ghost", "role": "viewer"}).status_code == 422
    assert client.post(f"/teams/finance/members/{newcomer.pk}/remove/").status_code == 302
    assert not Membership.objects.filter(team=team, user=newcomer).exists()
    # The last admin stays: a team is not left without one by its own admin.
    refused = client.post("/teams/finance/members/", {"username": "ada", "role": "viewer"})
    assert refused.status_code == 403 and "the last admin of Finance" in refused.content.decode()
    # A member who is no admin sees the members, not the forms, and is refused a change.
    other = logged_in(viewer)
    page = other.get("/teams/finance/").content.decode()
    assert "ada" in page and "Add a member" not in page
    refused = other.post("/teams/finance/members/", {"username": "nico", "role": "admin"})
    assert refused.status_code == 403 and "you need the admin role" in refused.content.decode()
    # Someone of another team: no such team.
    outsider = User.objects.create_user("otto")
    assert logged_in(outsider).get("/teams/finance/").status_code == 404


def test_manage_py_team_member_sets_changes_and_removes_roles(team: Team, capsys: Any) -> None:
    user = User.objects.create_user("robo")
    call_command("team_member", "finance", "robo", "--role", "admin")
    assert "robo is admin in finance (new member)" in capsys.readouterr().out
    call_command("team_member", "finance", "robo", "--role", "auditor")  # the last admin: the CLI may
    assert "robo is auditor in finance (was admin)" in capsys.readouterr().out
    call_command("team_member", "finance", "robo", "--remove")
    assert not Membership.objects.filter(user=user).exists()
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("team_member", "finance", "nobody", "--role", "viewer")
    with pytest.raises(CommandError, match="no team with slug 'nope'"):
        call_command("team_member", "nope", "robo", "--role", "viewer")


def test_only_those_who_decide_revoke_a_grant(team: Team) -> None:
    giver = in_role(team, "gina", Role.APPROVER)
    requester = in_role(team, "rex", Role.APPROVER)
    first = start(team, 8, requester)
    engine.approve(first, {"approved": True}, giver, grant=engine.GrantAsked("hour"))
    (grant,) = Grant.objects.filter(granted_by=giver)
    for role in (Role.VIEWER, Role.AUDITOR):
        reader = in_role(team, f"r-{role}", role)
        with pytest.raises(engine.NotAllowed, match="To revoke a grant you need the approver role"):
            engine.revoke_grant(grant, reader)
        page = logged_in(reader).post(f"/grants/{grant.pk}/revoke/", follow=True).content.decode()
        assert "you need the approver role" in page
    grant.refresh_from_db()
    assert grant.revoked_at is None
    assert engine.revoke_grant(grant, in_role(team, "apu", Role.APPROVER))


def test_roles_follow_an_escalation_to_the_team_it_went_to(team: Team, other_team: Team) -> None:
    # A viewer of the first team who approves in the team it escalated to decides it there; a
    # viewer of that team does not.
    both = in_role(team, "bo", Role.VIEWER)
    Membership.objects.create(team=other_team, user=both, role=Role.APPROVER)
    looker = in_role(other_team, "lou", Role.VIEWER)
    it = start(team, 9)
    Interrupt.objects.filter(pk=it.pk).update(escalate_to=other_team, escalated_at=timezone.now())
    it.refresh_from_db()
    assert engine.may_decide(both, it) and not engine.may_decide(looker, it)
    assert "yours is viewer" in engine.why_not(looker, it)


def test_a_team_whose_members_come_from_the_provider_is_not_changed_by_hand(team: Team) -> None:
    from actions.models import SignInGroup

    admin = in_role(team, "ada", Role.ADMIN)
    SignInGroup.objects.create(group="finance", team=team, role=Role.APPROVER)
    User.objects.create_user("nico")
    refused = logged_in(admin).post("/teams/finance/members/", {"username": "nico", "role": "viewer"})
    assert refused.status_code == 403 and "come from the identity provider" in refused.content.decode()
    with pytest.raises(engine.NotAllowed, match="come from the identity provider"):
        engine.members.set_role(team, User.objects.get(username="nico"), Role.VIEWER, admin)
    call_command("team_member", "finance", "nico", "--role", "viewer")  # automation may
    assert Membership.objects.get(team=team, user__username="nico").role == Role.VIEWER


def test_a_teams_policy_assigns_only_people_who_decide(team: Team) -> None:
    from django.contrib import admin as django_admin
    from django.test import RequestFactory

    from actions.models import Policy

    request = RequestFactory().get("/admin/")
    request.user = User.objects.create_superuser("root", password="pw-root-1234")
    PolicyForm = django_admin.site.get_model_admin(Policy).get_form(request)  # noqa: N806 - a class
    in_role(team, "vera", Role.VIEWER)
    in_role(team, "apu", Role.APPROVER)
    data = {"team": team.pk, "action": "send_invoice", "approvals_required": 1}
    refused = PolicyForm(data={**data, "assignees": "apu, vera"})
    assert (
        not refused.is_valid() and "Not an approver or admin of Finance: vera." in refused.errors["assignees"]
    )
    assert PolicyForm(data={**data, "assignees": "apu"}).is_valid()
