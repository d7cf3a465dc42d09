"""Reaching reviewers: the time from a new interrupt to its mail in an SMTP server
(aiosmtpd), its webhook at a receiver, and its Slack message at a local server speaking Slack's
Web API, on the embedded setup (`manage.py serve`, SQLite) as `make run` serves it, with SMTP,
Slack and the webhook configured. Runs are started one after another through the API; the
clock starts when the POST that starts the run is sent (before the commit: an upper bound).

    python -m bench.notify_latency [--runs 60] [--reviewers 20] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import percentile, served_site  # noqa: E402
from tests.integration.processes import wait_for  # noqa: E402
from tests.slack_server import SIGNING_SECRET, TOKEN, SlackServer  # noqa: E402
from tests.smtp_server import Mailbox, text_of  # noqa: E402
from tests.webhook_receiver import Receiver  # noqa: E402


def line(what: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    return (
        f"  {what:<28} p50 {ordered[len(ordered) // 2]:7.1f} ms   p99 {percentile(samples, 0.99):7.1f} ms"
        f"   max {ordered[-1]:7.1f} ms   ({len(samples)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--reviewers", type=int, default=20, help="more reviewers in the team, each mailed")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between starting runs")
    args = parser.parse_args()
    mailbox, slack, receiver = Mailbox(), SlackServer(), Receiver()
    created: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
            url = f"sqlite:///{tmp}/bench.sqlite3"
            channels = served_site(
                Path(tmp),
                url,
                scaled=False,
                EMAIL_HOST="127.0.0.1",
                EMAIL_PORT=str(mailbox.port),
                SLACK_BOT_TOKEN=TOKEN,
                SLACK_SIGNING_SECRET=SIGNING_SECRET,
                SLACK_API_URL=slack.url,
                GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true",
            )
            with channels as (site, server, token):
                site.manage(
                    "shell",
                    "-c",
                    "from actions.models import Team, TeamChannels;"
                    "TeamChannels.objects.create(team=Team.objects.get(slug='demo'), slack_channel='C0DEMO')",
                )
                site.manage(
                    "shell",
                    "-c",
                    "from django.contrib.auth.models import User; from actions.models import Team;"
                    f"team = Team.objects.get(slug='demo'); n = {args.reviewers};"
                    "team.members.add(*[User.objects.create_user(f'bench{i}', f'bench{i}@example.com')"
                    " for i in range(n)])",
                )
                with server.client(token) as api:
                    hook = api.post(
                        "/api/webhooks", json={"url": receiver.url, "events": ["interrupt.created"]}
                    )
                    assert hook.status_code == 201, hook.text
                    for n in range(args.runs):
                        invoice = f"BENCH-{n:04d}"
                        created[invoice] = time.time()
                        run = api.post(
                            "/api/runs",
                            json={"action": "send_invoice", "input": {"invoice_id": invoice, "amount": 1}},
                            headers={"Prefer": "wait=20"},
                        ).json()
                        assert run["status"] == "interrupted", run
                        time.sleep(args.interval)
                wanted = args.runs
                mails = (2 + args.reviewers) * wanted
                wait_for(lambda: len(mailbox.messages) >= mails or None, timeout=300, what="the mails")
                wait_for(lambda: len(receiver.received) >= wanted or None, timeout=60, what="the webhooks")
                wait_for(
                    lambda: len(slack.called("chat.postMessage")) >= wanted or None, timeout=60, what="Slack"
                )
        mail_ms = []
        for arrived, message in mailbox.messages:
            invoice = next(i for i in created if i in text_of(message))
            mail_ms.append((arrived - created[invoice]) * 1000)
        hook_ms = []
        for (_, body), arrived in zip(receiver.received, receiver.times, strict=True):
            invoice = next(i for i in created if i.encode() in body)
            hook_ms.append((arrived - created[invoice]) * 1000)
        slack_ms = []
        for (method, params), arrived in zip(slack.calls, slack.times, strict=True):
            if method == "chat.postMessage":
                invoice = next(i for i in created if i in str(params["blocks"]))
                slack_ms.append((arrived - created[invoice]) * 1000)
    finally:
        mailbox.stop()
        slack.stop()
        receiver.stop()
    print(
        "From the API call that starts a run to its reviewers, embedded (manage.py serve, SQLite),"
        f" {args.runs} runs {args.interval} s apart, a team of {2 + args.reviewers}:"
    )
    print(line("mail in the SMTP server", mail_ms))
    print(line("webhook at the receiver", hook_ms))
    print(line("Slack chat.postMessage", slack_ms))


if __name__ == "__main__":
    main()
