"""A flood of bad websocket frames against `manage.py serve`: each socket is closed with an
application close code and let go of entirely, so the server's memory returns to its level."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import httpx
import pytest

from tests.integration.processes import Server, Site, logged_in_reviewer

pytestmark = pytest.mark.integration


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def session_cookie(web: Server) -> str:
    return f"sessionid={logged_in_reviewer(web).cookies['sessionid']}"


async def bad_frames(web: Server, cookie: str, count: int) -> list[int]:
    import websockets

    codes: list[int] = []
    for n in range(count):
        async with websockets.connect(
            f"ws://127.0.0.1:{web.port}/ws/inbox/",
            additional_headers={"Cookie": cookie, "Origin": web.url},
            open_timeout=5,
            close_timeout=2,
        ) as ws:
            await ws.recv()  # hello
            await ws.send(b"\x00" * 16 if n % 2 else "x" * 8000)
            try:
                await asyncio.wait_for(ws.recv(), 5)
            except websockets.ConnectionClosed as closed:
                assert closed.rcvd is not None
                codes.append(closed.rcvd.code)
            except TimeoutError:
                raise AssertionError(f"socket {n} was not closed after a bad frame") from None
    return codes


def test_a_thousand_bad_frames_close_cleanly_and_memory_returns_to_its_level(site: Site) -> None:
    web = site.serve()
    cookie = session_cookie(web)
    asyncio.run(asyncio.wait_for(bad_frames(web, cookie, 100), 60))  # warm up: imports, caches, pools
    gc.collect()
    before = rss_mb(web.proc.pid)
    codes = asyncio.run(asyncio.wait_for(bad_frames(web, cookie, 1000), 240))
    after = rss_mb(web.proc.pid)
    assert sorted(set(codes)) == [4003, 4009] and len(codes) == 1000
    assert after - before < 20, f"RSS grew from {before:.0f} MB to {after:.0f} MB"
    logs = site.logs()
    assert "invalid close code" not in logs and "Traceback" not in logs
    # The server still serves.
    assert httpx.get(f"{web.url}/login/").status_code == 200
