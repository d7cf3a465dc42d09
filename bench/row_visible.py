"""Row visible: from the API call that starts a run to its row being in every reviewer's inbox.

N simulated pages do what static/js/live.js does in the version served: each holds a websocket
and fetches its list (the htmx fragment of `/`) when the socket says hello; then, per frame,
- a frame that carries the change (it has "seq"): the row is in the page when the frame holds
  it, with each of the page's team streams numbered one after the last it saw; a frame whose
  number skips one makes the page fetch its list again, and the row is in when that fetch has it;
- a hint (earlier versions, no "seq"): the page fetches its list, as the old live.js did on
  every frame, and the row is in when a fetch has it.
A page "misses" a row it does not have 30 s after the run started.

Timed from just before `POST /api/runs` (a run that pauses at once) to each page having the
row, for N = 1, 100, 1,000 pages and 200 and 1,000 interrupts already pending; embedded
(`manage.py serve` on SQLite) and scaled (PostgreSQL, Redis, two daphne processes with the pages
split between them, one Celery worker). Also the server's CPU time per event (web and worker
processes together), which must not grow with the number of pending interrupts.

    python -m bench.row_visible [--sizes 1,100,1000] [--pending 200,1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from html import unescape
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_seconds, percentile, raise_file_limit, served_site  # noqa: E402
from bench.push_latency import MAKE_SESSIONS  # noqa: E402

MISSED_AFTER = 30.0

POPULATE = """
from datetime import timedelta
from django.utils import timezone
from actions.models import Interrupt, Run, Team
team = Team.objects.get(slug="demo")
have = Interrupt.objects.filter(team=team, status="pending").count()
want = {pending} - have
now = timezone.now()
runs = Run.objects.bulk_create(
    [Run(action="bench_pause", team=team, status="interrupted", input={{"n": i}}) for i in range(want)]
)
Interrupt.objects.bulk_create([
    Interrupt(run=run, seq=1, team=team, action="bench_pause", message="Approve?",
              data={{"n": i}}, binding={{"action": "bench_pause"}},
              created_at=now - timedelta(minutes=5, seconds=i))
    for i, run in enumerate(runs)
])
print(Interrupt.objects.filter(team=team, status="pending").count())
"""


class Page:
    """One reviewer's inbox page, as live.js runs it."""

    def __init__(self, server: Any, session: str) -> None:
        self.server, self.session = server, session
        self.last: dict[str, int] = {}
        self.teams: list[str] = []
        self.seen: dict[int, float] = {}  # interrupt id -> when the row was in the page
        self.fetches = 0
        self.reconnects = 0
        self.ready = asyncio.Event()

    async def fetch_list(self, http: Any) -> None:
        self.fetches += 1
        response = await http.get("/", headers={"HX-Request": "true", "Cookie": f"sessionid={self.session}"})
        response.raise_for_status()
        body = response.text
        now = time.monotonic()
        section = body[: body.index(">", body.index('<section id="inbox"'))]
        if (seq := re.search(r'data-seq="([^"]*)"', section)) is not None:
            self.last = json.loads(unescape(seq.group(1)))
            self.teams = re.search(r'data-teams="([^"]*)"', section).group(1).split(",")  # type: ignore[union-attr]
        for found in re.finditer(r'<tr id="interrupt-(\d+)"', body):
            self.seen.setdefault(int(found.group(1)), now)

    def apply(self, frame: dict[str, Any]) -> bool:
        """The frame applied as live.js does; False if a number skipped one (fetch again)."""
        fresh = {}
        for team, n in frame["seq"].items():
            if team not in self.teams:
                continue
            have = self.last.get(team, 0)
            if n <= have:
                continue
            if n != have + 1:
                return False
            fresh[team] = n
        if fresh:
            self.last.update(fresh)
            if frame.get("html") and frame["after"]:
                self.seen.setdefault(frame["interrupt_id"], time.monotonic())
        return True

    async def live(self, http: Any, url: str) -> None:
        """The socket, reconnected after a failure as htmx's ws extension does (with backoff),
        each (re)connect greeted by hello, which makes the page fetch its list."""
        import websockets

        delay = 0.5
        while True:
            try:
                async with websockets.connect(
                    url,
                    additional_headers={"Cookie": f"sessionid={self.session}", "Origin": self.server.url},
                    max_queue=None,
                ) as ws:
                    delay = 0.5
                    async for raw in ws:
                        frame = json.loads(raw)
                        if frame.get("event") == "hello":
                            await self.fetch_list(http)
                            self.ready.set()
                        elif "seq" in frame:
                            if not self.apply(frame):
                                await self.fetch_list(http)
                        else:
                            await self.fetch_list(http)  # a hint: the old page refetched on every frame
            except (OSError, websockets.exceptions.WebSocketException):
                self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)


async def measure(
    servers: list[Any], pids: list[int], token: str, sessions: list[str], rounds: int
) -> tuple[list[float], int, float, int]:
    import httpx

    limits = httpx.Limits(max_connections=200)
    clients = [httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) for server in servers]
    pages = [Page(servers[i % len(servers)], key) for i, key in enumerate(sessions)]
    tasks = []
    for i, page in enumerate(pages):
        server = servers[i % len(servers)]
        tasks.append(
            asyncio.create_task(
                page.live(clients[i % len(servers)], f"ws://127.0.0.1:{server.port}/ws/inbox/")
            )
        )
        if i % 50 == 49:
            # Pages open over a morning, not all in one second: a wave at a time.
            while not all(page.ready.is_set() for page in pages[: i + 1]):
                await asyncio.sleep(0.05)
    deadline = time.monotonic() + 600
    while not all(page.ready.is_set() for page in pages):
        assert time.monotonic() < deadline, (
            f"{sum(p.ready.is_set() for p in pages)} of {len(pages)} pages ready"
        )
        await asyncio.sleep(0.1)
    fetches_before = sum(page.fetches for page in pages)
    reconnects_before = sum(page.reconnects for page in pages)

    samples: list[float] = []
    missed = 0
    cpu_before = cpu_seconds(pids)
    async with httpx.AsyncClient(
        base_url=servers[0].url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as api:
        for n in range(rounds):
            await asyncio.sleep(0.3)  # one new approval at a time, as they arrive
            started = time.monotonic()
            response = await api.post(
                "/api/runs", json={"action": "bench_pause", "input": {"n": n}}, headers={"Prefer": "wait=30"}
            )
            interrupt_id = response.json()["interrupt"]["id"]
            deadline = started + MISSED_AFTER
            while not all(interrupt_id in page.seen for page in pages) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            for page in pages:
                if interrupt_id in page.seen:
                    samples.append((page.seen[interrupt_id] - started) * 1000)
                else:
                    missed += 1
    cpu = cpu_seconds(pids) - cpu_before
    fetches = sum(page.fetches for page in pages) - fetches_before
    assert sum(page.reconnects for page in pages) == reconnects_before, "a socket dropped while measuring"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for client in clients:
        await client.aclose()
    return samples, missed, cpu / rounds * 1000, fetches


def run_setup(name: str, sizes: list[int], pendings: list[int], rounds: int) -> list[str]:
    from tests.integration.services import Postgres

    lines = []
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        postgres = Postgres() if name == "scaled" else None
        database_url = f"sqlite:///{tmp}/rows.sqlite3"
        if postgres is not None:
            postgres.init()
            postgres.start()
            database_url = postgres.create_database("row_visible")
        try:
            recheck = {"GRUNDLAG_SOCKET_RECHECK_SECONDS": "3600"}
            with served_site(Path(tmp), database_url, scaled=postgres is not None, **recheck) as (
                site,
                server,
                token,
            ):
                servers = [server] + ([site.web()] if postgres is not None else [])
                pids = [proc.pid for proc in site.processes]
                all_sessions = json.loads(
                    site.manage("shell", "-c", MAKE_SESSIONS.format(count=max(sizes))).split("\n")[-2]
                )
                for pending in pendings:
                    site.manage("shell", "-c", POPULATE.format(pending=pending))
                    for size in sizes:
                        samples, missed, cpu_ms, fetches = asyncio.run(
                            measure(servers, pids, token, all_sessions[:size], rounds)
                        )
                        lines.append(
                            f"  {name:<8} pending={pending:<5} N={size:<5} "
                            f"p50 {statistics.median(samples):8.1f} ms  "
                            f"p99 {percentile(samples, 0.99):8.1f} ms  "
                            f"missed {missed}  list fetches {fetches:<5} "
                            f"server CPU {cpu_ms:7.1f} ms/event"
                        )
                        print(lines[-1], flush=True)
        finally:
            if postgres is not None:
                postgres.cleanup()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--pending", default="200,1000")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--setups", default="embedded,scaled")
    args = parser.parse_args()
    raise_file_limit()
    sizes = [int(size) for size in args.sizes.split(",")]
    pendings = [int(p) for p in args.pending.split(",")]
    print(f"Row visible: API call that starts a run -> its row in every page ({args.rounds} runs each)")
    print("Goals: p99 < 150 ms at N=100 with 200 pending (embedded); p99 < 1 s at N=1000 (scaled);")
    print("no page misses a row; server CPU per event flat in the number pending")
    for setup in args.setups.split(","):
        run_setup(setup, sizes, pendings, args.rounds)


if __name__ == "__main__":
    main()
