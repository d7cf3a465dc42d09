"""`make bench-check`'s verdicts (bench/check.py): what is worse by more than 20 % fails."""

from __future__ import annotations

import pytest

from bench import check

BASELINE = {figure.name: 100.0 for figure in check.FIGURES} | {
    "langgraph sqlite cycles/s": 150.0,
    "langgraph step p50": 2.0,
}


def test_a_rate_more_than_a_fifth_lower_fails_and_a_time_a_quarter_longer_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    measured = dict(BASELINE)
    measured["engine postgresql"] = 79.0  # 21 % fewer cycles a second
    measured["api step p50 embedded"] = 126.0  # 21 % slower
    measured["api step p50 scaled"] = 124.0  # 19 % slower: within the tolerance
    measured["engine sqlite / langgraph"] = 81.0  # 19 % lower: within it
    failed = check.compare(measured, BASELINE)
    assert [line.split(":")[0] for line in failed] == ["engine postgresql", "api step p50 embedded"]
    out = capsys.readouterr().out
    assert "WORSE" in out and "api step p50 scaled" in out


def test_better_figures_and_a_figure_without_a_baseline_pass() -> None:
    measured = dict(BASELINE)
    measured["engine postgresql"] = 300.0
    measured["site cpu per cycle scaled"] = 20.0
    baseline = dict(BASELINE)
    del baseline["site cpu per cycle embedded"]
    assert check.compare(measured, baseline) == []


def test_the_loss_is_the_same_for_a_rate_and_a_time() -> None:
    rate, time = check.FIGURES[1], check.FIGURES[2]
    assert not time.higher_is_better and rate.higher_is_better
    assert check.worse_by(rate, 80.0, 100.0) == pytest.approx(0.2)
    assert check.worse_by(time, 125.0, 100.0) == pytest.approx(0.2)
