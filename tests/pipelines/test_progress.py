"""Status and progress lines (``rmserve.pipelines.progress``): terminal vs log output, timing."""

from __future__ import annotations

import io

import pytest
from rmserve.pipelines.progress import ProgressLine, StatusLine, duration_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (45, "45 s"), (59.6, "1 min 0 s"), (211.5, "3 min 32 s"), (3600 + 5 * 60 + 29, "1 h 05 min")],
)
def test_duration_text(seconds, text):
    assert duration_text(seconds) == text


def test_status_line_off_a_terminal_repeats_every_15_s_and_on_a_change_of_kind():
    out, clock = io.StringIO(), Clock()
    status = StatusLine(stream=out, tty=False, clock=clock)
    status.show("a 0", kind="refused")
    clock.now += 14.9
    status.show("a 14.9", kind="refused")  # not due yet
    clock.now += 0.1
    status.show("a 15", kind="refused")  # 15 s after the first line
    clock.now += 1
    status.show("b 16", kind="loading")  # another kind: at once
    status.finish("done")
    assert out.getvalue() == "a 0\na 15\nb 16\ndone\n"


def test_status_line_on_a_terminal_is_rewritten_in_place():
    out, clock = io.StringIO(), Clock()
    status = StatusLine(stream=out, tty=True, clock=clock)
    status.show("starting… 0 s")
    clock.now += 0.5
    status.show("starting… 0.5 s")  # within refresh_s (1 s): skipped
    clock.now += 0.5
    status.show("starting… 1 s")
    status.finish("starting… ready after 1 s")
    assert out.getvalue() == (
        "\rstarting… 0 s\x1b[K" "\rstarting… 1 s\x1b[K" "\rstarting… ready after 1 s\x1b[K\n"
    )


def test_status_line_end_keeps_the_last_status_and_finish_needs_a_shown_status():
    out = io.StringIO()
    status = StatusLine(stream=out, tty=True, clock=Clock())
    status.finish("ready after 0 s")  # nothing was shown: nothing to end
    assert out.getvalue() == ""
    status.finish("ready after 0 s", always=True)
    status.show("waiting")
    status.end()
    status.end()
    assert out.getvalue() == "\rready after 0 s\x1b[K\n\rwaiting\x1b[K\n"


def test_quiet_status_and_progress_write_nothing():
    out = io.StringIO()
    status = StatusLine(stream=out, tty=False, quiet=True)
    status.show("x")
    status.finish("y", always=True)
    bar = ProgressLine(10, stream=out, quiet=True, interval_s=1e-9)
    bar.update(10)
    bar.close()
    assert out.getvalue() == ""


def test_progress_line_every_interval_with_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(798, 100, stream=out, clock=clock)  # 100 resumed groups
    clock.now += 4
    bar.update(10)  # 4 s < 5 s: no line
    clock.now += 36
    bar.update(110)  # 120 done by this run in 40 s: 3.0 groups/s; 578 left → 192.7 s
    bar.set_postfix_str("1,234 tok/s", refresh=False)
    clock.now += 1
    bar.update(1)
    clock.now += 9
    bar.update(577)  # all 798: 698 in 50 s = 13.96 groups/s
    bar.close()
    bar.close()
    assert out.getvalue().splitlines() == [
        "scoring: 220/798 groups, 3.0 groups/s, ETA 3 min 13 s",
        "scoring: 798/798 groups, 14.0 groups/s, done in 50 s, 1,234 tok/s",
    ]


def test_progress_line_without_progress_says_eta_unknown_and_closes_silently():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(10, 0, label="step-100", stream=out, clock=clock)
    assert bar.text() == "step-100: 0/10 groups, 0.0 groups/s, ETA unknown"
    bar.close()
    assert out.getvalue() == ""


@pytest.mark.parametrize("kwargs", [{"repeat_s": 0}, {"refresh_s": -1}])
def test_status_line_refuses_bad_intervals(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        StatusLine(**kwargs)
