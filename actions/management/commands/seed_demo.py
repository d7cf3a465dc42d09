from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.test.utils import override_settings

from actions import engine
from actions.drivers.agent import start_agent
from actions.drivers.approval import request_approval
from actions.models import ApiToken, Policy, Role, Run, Team, TeamRule

DEMO_RUNS = [
    ("send_invoice", {"invoice_id": "INV-2041", "amount": 420.0}),
    ("transfer_funds", {"amount": 2500.0, "to": "DE89 3704 0044 0532 0130 00"}),
    ("delete_customer_data", {"customer_id": "cus_8812", "requested_by": "support ticket #3312"}),
    ("await_payment", {"reference": "RF18 5390 0754 7034", "expected_amount": 980.0}),
    (
        "publish_announcement",
        {"title": "Maintenance on Sunday", "body": "The portal is offline 02:00-04:00 UTC."},
    ),
]

# Rules to show in the admin: one in force, one to dry-run before enabling it.
DEMO_RULES: dict[str, dict[str, Any]] = {
    "big transfers need two": {
        "action": "transfer_funds", "when": "data.amount > 10000.0", "then": "require", "approvals": 2,
    },
    "small invoices": {
        "action": "send_invoice", "when": "data.amount < 50.0", "then": "approve", "position": 1,
        "enabled": False,
    },
}  # fmt: skip

# A scripted model (no model server needed): it looks the customer up, then asks to send the
# invoice, which pauses for a reviewer; after the answer it reports back.
DEMO_AGENT_MESSAGES = [
    {"role": "system", "content": "You are the billing assistant. Use the tools."},
    {"role": "user", "content": "Invoice ACME (cus_4711) for the October retainer, 1,800 EUR."},
]
DEMO_AGENT_MODEL = {
    "scripted": [
        {
            "content": "Looking the customer up first.",
            "tool_calls": [
                {"id": "call_lookup", "name": "lookup_customer", "arguments": {"customer_id": "cus_4711"}}
            ],
        },
        {
            "content": "Sending the invoice; this needs approval.",
            "tool_calls": [
                {
                    "id": "call_send",
                    "name": "send_invoice",
                    "arguments": {"invoice_id": "INV-OCT-4711", "amount": 1800.0},
                }
            ],
        },
        {"content": "Done: the October invoice went to ACME."},
    ]
}


DEMO_APPROVAL: dict[str, Any] = {
    "message": "Deploy billing 2.3 to production?",
    "data": {"service": "billing", "version": "2.3", "changes": 14, "migrations": ["0042_invoice_terms"]},
    "answer_schema": {
        "type": "object",
        "properties": {
            "window": {"type": "string", "enum": ["tonight", "weekend"], "title": "Deploy window"},
            "notify_support": {"type": "boolean", "title": "Tell support first"},
        },
        "required": ["window"],
    },
}


class Command(BaseCommand):
    help = "Create the demo team, its users and an API token, and start a few runs. Idempotent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-runs", action="store_true", help="create users and token only")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        with transaction.atomic():
            team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo team"})
            other, _ = Team.objects.get_or_create(slug="payroll", defaults={"name": "Payroll"})
            people = {}
            for username, staff in (
                ("reviewer1", False),
                ("reviewer2", False),
                ("auditor", True),
                ("payroll1", False),
            ):
                user, _ = users.objects.get_or_create(username=username, defaults={"is_staff": staff})
                user.is_staff = user.is_superuser = staff
                # Demo passwords are fixed so a second `make run` prints the same ones.
                user.set_password(os.getenv("DEMO_PASSWORD", f"{username}-demo"))
                # Mail goes to the console under `make run`: a newcomer sees what reviewers get.
                user.email = user.email or f"{username}@example.com"
                user.save()
                people[username] = user
            # reviewer1 manages the demo team (its Team page), reviewer2 decides.
            team.members.add(people["reviewer1"], through_defaults={"role": Role.ADMIN})
            team.members.add(people["reviewer2"])
            other.members.add(people["payroll1"])
            # A policy to show in the inbox: announcements not decided within 8 hours expire.
            Policy.objects.get_or_create(
                team=team, action="publish_announcement", defaults={"deadline_minutes": 480}
            )
            # Rules to show in the admin: one in force, one to dry-run before enabling it.
            for name, rule in DEMO_RULES.items():
                TeamRule.objects.get_or_create(team=team, name=name, defaults=rule)
            ApiToken.objects.filter(team=team, name="demo", revoked_at=None).update(
                revoked_at=team.created_at
            )
            token, key = ApiToken.issue(team, "demo")

        started = 0
        if not options["no_runs"] and not Run.objects.filter(team=team).exists():
            # Without a broker (make run), their first steps run here as each is committed: the
            # server starts with them paused in the inbox, not queued by a process that is gone.
            # With one, the workers run them.
            inline = settings.CELERY_BROKER_URL.startswith("memory://") or settings.GRUNDLAG_INLINE_STEPS
            with override_settings(GRUNDLAG_INLINE_STEPS=inline):
                for action_name, payload in DEMO_RUNS:
                    engine.start_run(action_name, payload, team, people["reviewer2"], Run.Consumer.DASHBOARD)
                    started += 1
                start_agent(
                    DEMO_AGENT_MESSAGES,
                    ["lookup_customer", "send_invoice"],
                    DEMO_AGENT_MODEL,
                    team,
                    people["reviewer2"],
                )
                # As a service outside would ask (POST /api/approvals), with the demo token.
                request_approval(team, token, **DEMO_APPROVAL)
                started += 2

        for username in people:
            self.stdout.write(
                f"  user {username:<10} password {os.getenv('DEMO_PASSWORD', f'{username}-demo')}"
            )
        self.stdout.write(
            "  team demo: reviewer1 (admin), reviewer2 (approver); team payroll: payroll1; auditor is staff"
        )
        self.stdout.write(f"  started {started} demo run(s)")
        self.stdout.write(f"  API token for team demo: {key}")
