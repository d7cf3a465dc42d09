"""Push latency, and the server's memory with many reviewers connected.

N reviewers (logged-in websocket clients of the real app) are connected; a run is started that
pauses; each client times the frame that announces the interrupt, from the moment the engine
pushed it after commit (the frame's "at") to its arrival. p50/p99 for N = 1, 100, 1,000, on the
embedded setup (`manage.py serve`: in-memory layer) and on the scaled one (daphne + a Celery
worker process + channels-redis). Also prints the web process's RSS with the N sockets open.

    python -m bench.push_latency [--sizes 1,100,1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import percentile, raise_file_limit, served_site  # noqa: E402
from tests.integration.processes import Server  # noqa: E402

MAKE_SESSIONS = """
import json
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from actions.models import Team
User = get_user_model()
team = Team.objects.get(slug="demo")
names = [f"bench{{i}}" for i in range({count})]
User.objects.bulk_create([User(username=n, password="!") for n in names], ignore_conflicts=True)
users = list(User.objects.filter(username__in=names))
team.members.add(*users)
keys = []
for user in users:
    s = SessionStore()
    s[SESSION_KEY] = str(user.pk)
    s[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    s[HASH_SESSION_KEY] = user.get_session_auth_hash()
    s.create()
    keys.append(s.session_key)
print(json.dumps(keys))
"""


async def measure(server: Server, token: str, sessions: list[str], rounds: int) -> tuple[list[float], float]:
    import httpx
    import psutil
    import websockets

    url = f"ws://127.0.0.1:{server.port}/ws/inbox/"
    sockets = []
    for key in sessions:
        ws = await websockets.connect(
            url, additional_headers={"Cookie": f"sessionid={key}", "Origin": server.url}, max_queue=None
        )
        hello = json.loads(await ws.recv())
        assert hello["event"] == "hello", hello
        sockets.append(ws)
    rss = psutil.Process(server.proc.pid).memory_info().rss / 2**20

    # Each socket's reader stamps frames as they arrive, while the run is being started.
    arrivals: list[dict[int, float]] = [{} for _ in sockets]

    async def read(ws: Any, seen: dict[int, float]) -> None:
        async for raw in ws:
            frame = json.loads(raw)
            if frame.get("event") == "interrupt":
                seen[frame["interrupt_id"]] = (time.time() - frame["at"]) * 1000

    readers = [asyncio.create_task(read(ws, seen)) for ws, seen in zip(sockets, arrivals, strict=True)]
    samples: list[float] = []
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as api:
        for n in range(rounds):
            response = await api.post(
                "/api/runs", json={"action": "bench_pause", "input": {"n": n}}, headers={"Prefer": "wait=30"}
            )
            interrupt_id = response.json()["interrupt"]["id"]
            deadline = time.monotonic() + 30
            while not all(interrupt_id in seen for seen in arrivals):
                assert time.monotonic() < deadline, "frames did not arrive"
                await asyncio.sleep(0.01)
            samples += [seen[interrupt_id] for seen in arrivals]
    for reader in readers:
        reader.cancel()
    for ws in sockets:
        await ws.close()
    return samples, rss


def run_setup(name: str, sizes: list[int], rounds: int) -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        database_url = f"sqlite:///{tmp}/push.sqlite3"
        scaled = name == "channels-redis"
        recheck = {"GRUNDLAG_SOCKET_RECHECK_SECONDS": "3600"}
        with served_site(Path(tmp), database_url, scaled=scaled, **recheck) as (site, server, token):
            all_sessions = json.loads(
                site.manage("shell", "-c", MAKE_SESSIONS.format(count=max(sizes))).split("\n")[-2]
            )
            for size in sizes:
                samples, rss = asyncio.run(measure(server, token, all_sessions[:size], rounds))
                lines.append(
                    f"  {name:<15} N={size:<5} p50 {statistics.median(samples):7.1f} ms   "
                    f"p99 {percentile(samples, 0.99):7.1f} ms   ({len(samples)} frames)   "
                    f"web RSS {rss:6.1f} MB"
                )
                print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--setups", default="embedded,channels-redis")
    args = parser.parse_args()
    raise_file_limit()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"Push latency, commit to frame at every client ({args.rounds} runs per size)")
    print("Goal: p99 under 50 ms at N=100; web RSS under 250 MB at N=1000")
    for setup in args.setups.split(","):
        run_setup(setup, sizes, args.rounds)


if __name__ == "__main__":
    main()
