"""The embedded server's notifier: a process of its own beside `manage.py serve`.

Fanning out an event and rendering and sending its mails is Python work, as much per approval
as the step itself; in the server's process it took the interpreter from the requests and
steps beside it, and a resume waited behind the mails of the approval it answered. In a
process of its own it runs on another core. The server tells it what to do through a pipe,
one line each ("runs 4 7": those runs logged something worth telling; "all": look at every
recent event; "deliver 12": send that notification now); it tells nothing back. The database
is the outbox, as ever: a line lost with a notifier that died is found by the next one's first
round, which looks at everything (``dispatch_missed``, ``deliver_due``), as its periodic round
does every GRUNDLAG_SWEEP_SECONDS. The scaled setup has no notifier: Celery's workers deliver.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence

from django.conf import settings

logger = logging.getLogger(__name__)

# Set in `manage.py serve` while its notifier runs: where dispatch_soon and schedule send work.
current: Notifier | None = None

RESTART_DELAYS = (0.5, 1, 2, 5, 10, 30)
STABLE_SECONDS = 60  # a notifier that lived this long and died is started again at once


class Notifier:
    """The parent's end: spawns the notifier, feeds it lines, and starts it again should it die.
    Nothing here blocks the caller (an engine signal, after commit): lines go through a queue
    to a thread that writes them."""

    def __init__(self, command: Sequence[str] | None = None) -> None:
        self.command = list(command or [sys.executable, str(settings.BASE_DIR / "manage.py"), "notifier"])
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._feed, name="grundlag-notifier-feed", daemon=True)
        self._restarts = 0
        self._started_at = 0.0
        self._stopping = False

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def wake(self, runs: Collection[int] | None) -> None:
        """Those runs logged something worth telling (None: look at every recent event)."""
        self._lines.put("all" if runs is None else "runs " + " ".join(str(int(run)) for run in sorted(runs)))

    def deliver(self, notification_id: int) -> None:
        self._lines.put(f"deliver {int(notification_id)}")

    def ping(self) -> None:
        """Nothing to do: started again if it died (the server's periodic round sends it)."""
        self._lines.put("ping")

    def stop(self, timeout: float = 10) -> None:
        """Close its pipe: it finishes the deliveries under way and exits. It is sent SIGTERM
        first: a notifier still starting up (Django's setup takes seconds on a busy machine) has
        nothing under way and ends at once, instead of finishing its start only to stop; one
        that has started ignores it and waits for the pipe (`manage.py notifier`)."""
        self._stopping = True  # one that died meanwhile is not started again
        # Before the pipe closes: a notifier that has finished and is exiting has given its
        # handler up (the interpreter's shutdown), and would end by the signal, not with 0.
        self._terminate(running := self._proc)
        self._lines.put(None)
        self._thread.join(timeout)
        if (proc := self._proc) is not None:
            if proc is not running:  # started again meanwhile, by a line that found it dead
                self._terminate(proc)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("the notifier did not stop within %s s; killed", timeout)
                proc.kill()
                proc.wait()

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None:
            proc.terminate()  # nothing, if it has ended

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _spawn(self) -> None:
        # A process group of its own: Ctrl-C in a terminal stops the server, which then closes
        # the pipe; the notifier is never cut off mid-send by the same keystroke.
        self._proc = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, cwd=settings.BASE_DIR, process_group=0
        )
        self._started_at = time.monotonic()

    def _feed(self) -> None:
        while True:
            line = self._lines.get()
            if line is None:
                if (proc := self._proc) is not None and proc.stdin is not None:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()
                return
            try:
                self._write(line)
            except Exception:  # it cannot be started (no memory, no processes left): later
                logger.exception("the notifier could not be started; trying again with the next line")
                time.sleep(RESTART_DELAYS[-1])

    def _write(self, line: str) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
                return
            except (BrokenPipeError, OSError):
                pass
        if self._stopping:
            return
        # It died. Its successor's first round looks at everything, this line's work with it.
        if proc is not None:
            proc.wait()  # reaped: no zombie left behind
        if time.monotonic() - self._started_at > STABLE_SECONDS:
            self._restarts = 0  # it had lived a while: not a crash loop
        delay = RESTART_DELAYS[min(self._restarts, len(RESTART_DELAYS) - 1)]
        self._restarts += 1
        logger.error(
            "the notifier exited (%s); starting it again in %s s",
            proc.returncode if proc is not None else "not started",
            delay,
        )
        time.sleep(delay)
        if not self._stopping:  # the server may have stopped meanwhile
            self._spawn()
