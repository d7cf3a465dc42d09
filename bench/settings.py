"""The app's settings, plus the benchmark's baseline view (bench/urls.py)."""

from grundlag_site.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
