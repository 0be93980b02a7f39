"""Status and progress lines (``rmserve.pipelines.progress``): terminal vs log output, timing."""

from __future__ import annotations

import io

import pytest
from rmserve.pipelines.progress import EngineBar, ProgressLine, StatusLine, duration_text


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



def test_status_line_on_a_terminal_fits_the_terminal_width(monkeypatch):
    # A line wider than the terminal wraps, and "\r" then rewrites only its last row: the
    # earlier rows stay as a trail of copies. Each rewrite is cut to the width, less one column.
    monkeypatch.setenv("COLUMNS", "40")
    out, clock = io.StringIO(), Clock()
    status = StatusLine(stream=out, tty=True, clock=clock)
    status.show("starting server for demo-rm (log: runs/demo/server.log)… 0 s (not listening yet)")
    clock.now += 1
    status.show('waiting for http://h:8000: 503 {"error":\n  {"type": "not_ready"}}', kind="refused")
    assert out.getvalue() == (
        "\rstarting server for demo-rm (log: runs…\x1b[K"  # 38 characters and "…": 39 columns
        '\rwaiting for http://h:8000: 503 {"error…\x1b[K'  # the reply's newline became one space
    )
    assert [len(part) for part in out.getvalue().split("\x1b[K")[:2]] == [1 + 39, 1 + 39]
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: the line as it is
    wide = io.StringIO()
    StatusLine(stream=wide, tty=True, clock=Clock()).show("short line")
    assert wide.getvalue() == "\rshort line\x1b[K"


def test_status_line_off_a_terminal_is_never_cut(monkeypatch):
    monkeypatch.setenv("COLUMNS", "20")
    out = io.StringIO()
    StatusLine(stream=out, tty=False, clock=Clock()).show("x" * 50)
    assert out.getvalue() == "x" * 50 + "\n"

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
        "scoring: 220/798 groups, 3.0 groups/s, ETA 3 min 9 s",  # 110 groups in the 36 s since the first: 578 left
        "scoring: 798/798 groups, 14.0 groups/s, done in 50 s, 1,234 tok/s",
    ]


def test_progress_line_eta_comes_from_work_done_not_from_the_wait_for_the_first_group():
    # A cold engine answers the first group after 30 s, then 10 groups/s. Over the whole time
    # (51 groups in 35 s) the ETA would be 747 / 1.46 = 8 min 33 s; from work done it is
    # 747 / (50 groups / 5 s) = 74.7 s.
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(798, 0, stream=out, clock=clock)
    clock.now += 30
    bar.update(1)
    assert bar.text() == "scoring: 1/798 groups, 0.0 groups/s, ETA unknown"  # one point: no rate yet
    clock.now += 5
    bar.update(50)
    assert bar.text() == "scoring: 51/798 groups, 1.5 groups/s, ETA 1 min 15 s"


def test_progress_line_leaves_result_cache_groups_out_of_the_rate_and_the_eta():
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(100, 0, stream=out, clock=clock)
    clock.now += 1
    bar.cached = 40
    bar.update(40)  # 40 answered from the server's result cache at once: no engine work yet
    assert bar.text() == "scoring: 40/100 groups, 0.0 groups/s, ETA unknown"
    clock.now += 4
    bar.update(10)  # the engine's first 10 groups, 5 s after the start
    assert bar.text() == "scoring: 50/100 groups, 2.0 groups/s, ETA unknown"  # one engine point: no ETA yet
    clock.now += 4
    bar.update(10)  # 10 more by the engine in 4 s: 2.5 groups/s since its first; 40 left → 16 s
    bar.set_postfix_str("40 from the result cache, 25 tok/s (engine work only)")
    assert bar.text() == (  # 20 engine groups over 9 s = 2.2 groups/s
        "scoring: 60/100 groups, 2.2 groups/s, ETA 16 s, 40 from the result cache, 25 tok/s (engine work only)")


def test_a_run_answered_all_from_the_cache_ends_without_a_rate():
    # 30 groups resumed, 70 answered by the result cache in 2 s: the engine scored none, so the
    # end says so instead of "0.0 groups/s".
    out, clock = io.StringIO(), Clock()
    bar = ProgressLine(100, 30, stream=out, clock=clock)
    clock.now += 2
    bar.cached = 70
    bar.update(70)
    assert bar.text() == "scoring: 100/100 groups, none by the engine, done in 2 s"


def test_engine_bar_on_a_terminal_shows_the_engine_rate_and_eta_not_tqdm_s():
    # tqdm's own rate would be 60 groups over 9 s (6.7 group/s) and its ETA 40 / 6.7 = 6 s.
    out, clock = io.StringIO(), Clock()
    bar = EngineBar(100, 0, stream=out, clock=clock, ncols=100, ascii=True, mininterval=0, miniters=1)
    clock.now += 1
    bar.cached = 40
    bar.update(40)
    clock.now += 4
    bar.update(10)
    clock.now += 4
    bar.update(10)
    bar.set_postfix_str("40 from the result cache, 25 tok/s (engine work only)", refresh=False)
    assert str(bar) == (
        "scoring:  60%|######    | 60/100 [2.2 groups/s, ETA 16 s, 40 from the result cache, 25 tok/s (engine "
        "work only)]"
    )
    clock.now += 1
    bar.update(40)
    bar.close()
    assert out.getvalue().split("\r")[-1] == (
        "scoring: 100%|##########| 100/100 [6.0 groups/s, done in 10 s, 40 from the result cache, 25 tok/s (engine "
        "work only)]\n")  # 60 engine groups in 10 s
    assert "group/s" not in out.getvalue() and "<" not in out.getvalue()  # no tqdm rate, no tqdm remaining time


def test_progress_bar_is_an_engine_bar_on_a_terminal_and_a_progress_line_elsewhere(monkeypatch):
    from rmserve.pipelines.evaluate import progress_bar, show_rate

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    bar = progress_bar(10, 2, quiet=False, label="step-3")
    assert isinstance(bar, EngineBar) and (bar.desc, bar.n, bar.total) == ("step-3", 2, 10)
    show_rate(bar, 0.0, 0, 3)
    assert bar.cached == 3 and bar.postfix == "3 from the result cache, 0 tok/s (engine work only)"
    bar.close()
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert isinstance(progress_bar(10, 2, quiet=False), ProgressLine)


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
