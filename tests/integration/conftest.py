from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Site, sqlite_site


@pytest.fixture
def site(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Site]:
    """The app on a SQLite file of its own, with every process it starts stopped afterwards."""
    site = sqlite_site(tmp_path)
    yield site
    site.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(site.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
