"""The inbox and the history page at scale: server time of `/` and `/history/` with 1,000 and
with 100,000 interrupts in history (and 1,000 pending), and the ratio between the two (goal: at
most 1.3; it must not grow with history). The same for the history's full-text search: an
invoice number (one interrupt has it: what an auditor looks for), and a word that every
interrupt has (the worst case: every row matches, the page shows the newest 50).

    python -m bench.inbox_scale [--requests 30] [--postgresql]

The history is read as an auditor (staff: every team's) and as a member (their team's, and what
was escalated to it).

``--postgresql`` measures the same on a PostgreSQL server of the benchmark's own (SQLite otherwise).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import database_for, migrated_env

ROOT = Path(__file__).resolve().parents[1]


def populate(team: Any, history: int, pending: int) -> None:
    from django.utils import timezone

    from actions.models import Interrupt, Run

    now = timezone.now()
    for start in range(0, history + pending, 5000):
        size = min(5000, history + pending - start)
        runs = Run.objects.bulk_create(
            [Run(action="send_invoice", team=team, status="completed", input={}) for _ in range(size)]
        )
        rows = []
        for offset, run in enumerate(runs):
            i = start + offset
            is_pending = i >= history
            # History spread over a year; pending ones are recent.
            created = now - (
                timedelta(minutes=i % 600) if is_pending else timedelta(minutes=(i * 5) % 525_600 + 60)
            )
            rows.append(
                Interrupt(
                    run=run,
                    seq=1,
                    team=team,
                    action="send_invoice",
                    message=f"Approve invoice {i}?",
                    data={"invoice_id": f"INV-{i}", "amount": i % 997},
                    created_at=created,
                    status="pending" if is_pending else "approved",
                    decided_by_name="" if is_pending else "reviewer1",
                    decided_at=None if is_pending else created + timedelta(minutes=i % 90 + 1),
                )  # fmt: skip
            )
        Interrupt.objects.bulk_create(rows)
    settle()


def settle() -> None:
    """Measure a server's steady state, not the aftermath of loading rows in this process: fold
    the write-ahead log into the database and collect the loader's garbage first."""
    from django.db import connection

    from actions.engine import store

    # The planner's statistics, as the periodic round keeps them (every 30 s) on SQLite.
    store.refresh_statistics()
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        else:  # the planner's statistics, as autovacuum would have them after a bulk load
            cursor.execute("VACUUM ANALYZE")
    gc.collect()


def server_ms(client: Any, page: str, requests: int) -> float:
    url = page.split(" ")[0]
    client.get(url)  # warm
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    return statistics.median(times)


def child(requests: int) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.test import Client

    from actions.models import Interrupt, Team

    team = Team.objects.create(name="Bench", slug="bench")
    reviewer = User.objects.create_user("reviewer1")
    auditor = User.objects.create_user("auditor", is_staff=True)
    team.members.add(reviewer)
    reviewer_client, auditor_client = Client(), Client()
    reviewer_client.force_login(reviewer)
    auditor_client.force_login(auditor)

    pages = (
        ("/", reviewer_client),
        ("/history/", auditor_client),
        ("/history/?q=INV-517", auditor_client),
        ("/history/?q=invoice", auditor_client),
        # A member's view: their team's rows and those escalated to it.
        ("/history/ (member)", reviewer_client),
        ("/history/?q=invoice (member)", reviewer_client),
        ("/history/?q=INV-517 (member)", reviewer_client),
    )
    populate(team, 1_000, 1_000)
    small = {url: server_ms(c, url, requests) for url, c in pages}
    Interrupt.objects.filter(status="pending").delete()
    populate(team, 99_000, 1_000)
    assert Interrupt.objects.count() == 101_000
    large = {url: server_ms(c, url, requests) for url, c in pages}
    print(f"Server time (median of {requests} requests), 1,000 pending in both cases; goal: ratio <= 1.3")
    for url in small:
        ratio = large[url] / small[url]
        print(
            f"  {url:<34} 1,000 in history {small[url]:7.1f} ms   "
            f"100,000 in history {large[url]:7.1f} ms   ratio {ratio:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--postgresql", action="store_true", help="on PostgreSQL instead of SQLite")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.requests)
        return
    with database_for("scaled" if args.postgresql else "embedded", "scale") as (_, database_url):
        print("PostgreSQL" if args.postgresql else "SQLite")
        env = migrated_env(database_url)
        subprocess.run(
            [sys.executable, "-m", "bench.inbox_scale", "--child", "--requests", str(args.requests)],
            cwd=ROOT,
            env=env,
            check=True,
        )


if __name__ == "__main__":
    main()
