"""Decision throughput over HTTP: reviewers approve pending interrupts in the browser's way
(session cookie + CSRF token, form POST), a real Celery worker resumes each run, on PostgreSQL +
Redis; decisions per second until every run has completed. Baseline, in the same run and server:
a bare Django view doing one UPDATE per POST (goal: at least 0.3 of it).

    python -m bench.decision_throughput [--decisions 300] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import PRODUCTION_ENV  # noqa: E402
from tests.integration.processes import Site, base_env  # noqa: E402
from tests.integration.services import Postgres, Redis  # noqa: E402

MAKE_PENDING = """
import json
from actions import engine
from actions.models import Team
from grundlag_site.celery import run_tasks_where_sent
run_tasks_where_sent()
team = Team.objects.get(slug="demo")
ids = [engine.start_run("bench_pause", {{"n": i}}, team, None).interrupts.get().pk for i in range({count})]
print(json.dumps(ids))
"""


async def post_all(base: str, paths: list[str], concurrency: int) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        page = await client.get("/login/")
        csrf = client.cookies["csrftoken"]
        await client.post(
            "/login/",
            data={"username": "reviewer1", "password": "reviewer1-demo", "csrfmiddlewaretoken": csrf},
            headers={"Referer": f"{base}/login/"},
        )
        page = await client.get("/")
        token = re.search(r'"X-CSRFToken": "([^"]+)"', page.text)
        assert token, "not logged in"
        headers = {"X-CSRFToken": token.group(1), "Referer": f"{base}/"}
        queue = list(paths)
        started = time.perf_counter()

        async def worker() -> None:
            while queue:
                response = await client.post(queue.pop(), headers=headers)
                assert response.status_code in (204, 302), (response.status_code, response.text[:200])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    postgres, redis = Postgres(), Redis()
    postgres.init()
    postgres.start()
    redis.start()
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        env = base_env(postgres.create_database("decisions"), action_modules="actions.examples,bench.actions")
        env.update(PRODUCTION_ENV, REDIS_URL=redis.url, DJANGO_SETTINGS_MODULE="bench.settings")
        site = Site(env=env, log_dir=Path(tmp))
        try:
            site.manage("migrate", "--noinput", "-v0")
            site.manage("seed_demo", "--no-runs")
            ids = json.loads(
                site.manage("shell", "-c", MAKE_PENDING.format(count=args.decisions)).split("\n")[-2]
            )
            web = site.web()
            site.worker("bench", concurrency=4)

            bare = asyncio.run(
                post_all(web.url, [f"/bench/bare-update/{pk}/" for pk in ids], args.concurrency)
            )
            started = time.perf_counter()
            posting = asyncio.run(
                post_all(web.url, [f"/interrupts/{pk}/approve/" for pk in ids], args.concurrency)
            )
            while site.sql("SELECT COUNT(*) FROM actions_run WHERE status = 'completed'")[0][0] < len(ids):
                assert time.perf_counter() - started < 240, "runs did not complete in time"
                time.sleep(0.05)
            complete = time.perf_counter() - started
        finally:
            site.stop_all()
            redis.stop()
            postgres.cleanup()
    bare_rate, rate = len(ids) / bare, len(ids) / complete
    print(
        f"Decision throughput, {len(ids)} decisions, {args.concurrency} requests at a time, "
        "PostgreSQL + Redis"
    )
    print(f"  bare Django view, one UPDATE   {bare_rate:7.1f} requests/s")
    print(f"  approve until run completed    {rate:7.1f} decisions/s")
    print(f"  (the approve POSTs alone       {len(ids) / posting:7.1f} requests/s)")
    print(f"  ratio {rate / bare_rate:.2f} (goal: at least 0.3)")


if __name__ == "__main__":
    main()
