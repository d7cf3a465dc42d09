from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from actions import engine


class Command(BaseCommand):
    help = "Re-queue runs left stuck by a dead worker or a lost message (run periodically)."

    def handle(self, *args: Any, **options: Any) -> None:
        count = engine.sweep()
        self.stdout.write(f"re-queued {count} run(s)")
