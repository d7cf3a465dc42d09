"""Recovery: a worker is SIGKILLed while it holds steps, under load; how long until each of
those steps runs again (claimed by another worker) and has completed, and whether every step's
side effect happened once.

The scaled setup as deployed: PostgreSQL, Redis, one daphne, two Celery workers and Celery
beat (which runs the sweeper). Worker A claims the victims' steps (each works for
`--step-seconds`, then writes its side effect); once they are inside the step, worker B starts
and a load of other runs flows through the API; then A is killed. Timed from the kill to each
victim completing; bounded by `--bound` seconds. Steps are counted from the side-effect file:
each completed step's key must be there exactly once.

    python -m bench.recovery [--victims 4] [--step-seconds 8] [--rounds 3] [--bound 120]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import served_site  # noqa: E402


async def load(server: Any, token: str, stop: asyncio.Event) -> int:
    """Runs started and approved back to back, two at a time, until told to stop."""
    import httpx

    done = 0
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as api:

        async def one(n: int) -> None:
            run = (
                await api.post(
                    "/api/runs",
                    json={"action": "bench_pause", "input": {"n": n}},
                    headers={"Prefer": "wait=10"},
                )
            ).json()
            if run.get("interrupt"):
                await api.post(
                    f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}}
                )

        while not stop.is_set():
            await asyncio.gather(one(done), one(done + 1))
            done += 2
    return done


def round_once(
    site: Any, server: Any, token: str, effects: Path, n: int, args: Any
) -> tuple[list[float], int]:
    import httpx

    from tests.integration.processes import stop

    doomed = site.worker(f"doomed{n}", concurrency=args.victims)
    keys = [f"r{n}-v{i}" for i in range(args.victims)]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as api:
        runs = []
        for key in keys:
            run = api.post(
                "/api/runs",
                json={"action": "bench_effect", "input": {"key": key, "seconds": args.step_seconds}},
                headers={"Prefer": "wait=20"},
            ).json()
            assert run["status"] == "interrupted", run
            runs.append(run)
        for run in runs:
            api.post(f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}})
        deadline = time.monotonic() + 30
        while not all(api.get(f"/api/runs/{run['id']}").json()["status"] == "running" for run in runs):
            assert time.monotonic() < deadline, "the victims' steps did not start"
            time.sleep(0.05)
        claimed = time.monotonic()
        survivor = site.worker(f"survivor{n}", concurrency=4)
        time.sleep(2)  # the survivor is up and taking the load

        async def kill_under_load() -> tuple[list[float], int]:
            stopping = asyncio.Event()
            loader = asyncio.create_task(load(server, token, stopping))
            await asyncio.sleep(1)
            stop(doomed, signal.SIGKILL)
            killed = time.monotonic()
            killed_at = time.time()
            assert killed - claimed < args.step_seconds - 1, "the steps would have ended before the kill"
            done = set(effects.read_text().split())
            assert not done & set(keys), "a victim's step ended before the kill"
            recovered: dict[int, float] = {}
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as poll:
                while len(recovered) < len(runs) and time.monotonic() - killed < args.bound:
                    for run in runs:
                        if run["id"] not in recovered:
                            status = (await poll.get(f"/api/runs/{run['id']}")).json()["status"]
                            if status == "completed":
                                recovered[run["id"]] = time.monotonic() - killed
                    await asyncio.sleep(0.1)
            stopping.set()
            loaded = await loader
            missing = [run["id"] for run in runs if run["id"] not in recovered]
            assert not missing, f"runs {missing} did not complete within {args.bound} s of the kill"
            # When each step was claimed again (it runs again from then), by the run's log.
            restarted = []
            for run in runs:
                ((at,),) = site.sql(
                    "SELECT MAX(at) FROM actions_runevent WHERE run_id = %s AND kind = 'claimed'", run["id"]
                )
                restarted.append(at.timestamp() - killed_at)
            return restarted, list(recovered.values()), loaded

        again, times, loaded = asyncio.run(kill_under_load())
    stop(survivor)
    counted = Counter(effects.read_text().split())
    twice = {key: count for key, count in counted.items() if count != 1 and key in keys}
    assert all(counted[key] == 1 for key in keys), f"side effects not once each: {twice}"
    return again, times, loaded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--victims", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", type=float, default=120.0)
    args = parser.parse_args()
    from tests.integration.services import Postgres

    print(f"Recovery: SIGKILL a worker holding {args.victims} steps of {args.step_seconds:g} s, under load")
    print("Goal: every such step runs again within 15 s of the kill; each side effect once")
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        effects = Path(tmp) / "effects.txt"
        effects.touch()
        postgres = Postgres()
        postgres.init()
        postgres.start()
        try:
            database_url = postgres.create_database("recovery")
            with served_site(
                Path(tmp), database_url, scaled=True, workers=0, GRUNDLAG_BENCH_EFFECTS=str(effects)
            ) as (site, server, token):
                site.beat()
                samples: list[float] = []
                restarts: list[float] = []
                for n in range(args.rounds):
                    again, times, loaded = round_once(site, server, token, effects, n, args)
                    samples += times
                    restarts += again
                    print(
                        f"  round {n + 1}: running again after {min(again):5.1f} .. {max(again):5.1f} s, "
                        f"completed after {min(times):5.1f} .. {max(times):5.1f} s "
                        f"({loaded} other runs meanwhile)",
                        flush=True,
                    )
                print(
                    f"  scaled: kill -> step running again: max {max(restarts):5.1f} s; "
                    f"-> completed (the {args.step_seconds:g} s step included): "
                    f"p50 {sorted(samples)[len(samples) // 2]:5.1f} s max {max(samples):5.1f} s  "
                    f"({len(samples)} steps; each side effect once)"
                )
        finally:
            postgres.cleanup()


if __name__ == "__main__":
    main()
