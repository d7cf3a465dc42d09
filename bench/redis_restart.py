"""A Redis restart: how long until the Celery workers take steps again.

The scaled setup as deployed (PostgreSQL, Redis, one daphne, one step worker, one notifications
worker; no beat, so no sweeper sends a lost step again: what is measured is the worker's own
reconnection). Each round restarts Redis, then starts a run through the API at once and times
it from Redis answering again to the run's step having paused (its message published by the
web process, taken by the worker once it has reconnected, the step run and recorded).

    python -m bench.redis_restart [--rounds 3] [--bound 120]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import served_site  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound", type=float, default=120.0)
    args = parser.parse_args()
    import httpx

    from tests.integration.services import Postgres

    print("Redis restart: from Redis answering again to a new run's step paused (a worker, no beat)")
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        postgres = Postgres()
        postgres.init()
        postgres.start()
        try:
            database_url = postgres.create_database("redis_restart")
            with served_site(Path(tmp), database_url, scaled=True) as (site, server, token):
                headers = {"Authorization": f"Bearer {token}"}
                with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:

                    def start(n: int, wait: int) -> dict[str, object]:
                        body = {"action": "bench_pause", "input": {"n": n}}
                        return dict(
                            api.post("/api/runs", json=body, headers={"Prefer": f"wait={wait}"}).json()
                        )

                    assert start(0, 20)["status"] == "interrupted", (
                        "the site does not work before the restart"
                    )
                    times = []
                    for n in range(1, args.rounds + 1):
                        site.redis.stop()
                        site.redis.start()  # returns once Redis answers
                        up = time.monotonic()
                        run = start(n, 0)
                        while run["status"] in ("queued", "running"):
                            assert time.monotonic() - up < args.bound, (
                                f"run {run['id']} still {run['status']}"
                            )
                            time.sleep(0.05)
                            run = dict(api.get(f"/api/runs/{run['id']}").json())
                        assert run["status"] == "interrupted", run
                        times.append(time.monotonic() - up)
                        print(
                            f"  round {n}: the step paused {times[-1]:5.2f} s after Redis was back",
                            flush=True,
                        )
                        time.sleep(2)  # settled before the next restart
                print(f"  max {max(times):5.2f} s over {len(times)} restarts")
        finally:
            postgres.cleanup()


if __name__ == "__main__":
    main()
