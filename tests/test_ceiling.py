"""ceiling: the same work in plain processes, and verdicts that judge a loader against it."""

import multiprocessing
import operator
import os
import signal
import subprocess
import sys
import time
from functools import partial

import pytest

from packdata import ceiling, compare


def record(folder, index):
    """Work that leaves a trace: one line per call, naming the process, in a file per index."""
    with open(folder / str(index), "a") as trace:
        trace.write(f"{os.getpid()}\n")


def test_every_index_once_per_call_in_processes_that_stay(tmp_path):
    run = ceiling.PlainProcesses(partial(record, tmp_path), 10, 3, context="fork")
    assert [run(), run()] == [10, 10]
    run.close()
    traces = {int(path.name): path.read_text().split() for path in tmp_path.iterdir()}
    assert sorted(traces) == list(range(10))
    assert all(len(pids) == 2 and pids[0] == pids[1] for pids in traces.values())
    assert len({pids[0] for pids in traces.values()}) == 3
    assert os.getpid() not in {int(pids[0]) for pids in traces.values()}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_work_reaches_spawned_processes(method):
    run = ceiling.PlainProcesses(abs, 7, 2, context=method)
    try:
        assert run() == 7
    finally:
        run.close()


def test_close_stops_the_processes():
    before = len(multiprocessing.active_children())
    run = ceiling.PlainProcesses(abs, 4, 2, context="fork")
    run()
    assert len(multiprocessing.active_children()) == before + 2
    run.close()
    assert len(multiprocessing.active_children()) == before


PARENT = """
import multiprocessing, sys
from packdata.ceiling import PlainProcesses
run = PlainProcesses(abs, 4, 2, context="fork")
run()
print(*(child.pid for child in multiprocessing.active_children()), flush=True)
sys.stdin.readline()  # killed meanwhile
"""


def test_the_processes_end_when_their_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    children = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(children) == 2
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in children)


def alive(pid):
    """Whether process ``pid`` still runs (an orphan's zombie is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_an_error_in_the_work_is_raised_with_its_traceback():
    run = ceiling.PlainProcesses(partial(operator.truediv, 1), 4, 2, context="fork")
    with pytest.raises(RuntimeError, match="(?s)plain process 0 of 2 failed.*ZeroDivisionError"):
        run()
    run.close()


def test_a_process_that_dies_is_named():
    run = ceiling.PlainProcesses(os._exit, 4, 2, context="fork")  # index 0 ends its process
    with pytest.raises(RuntimeError, match="plain process 0 of 2 died"):
        run()
    run.close()


def test_ctrl_c_ends_the_processes_quietly_and_the_next_calls_start_new_ones(capfd):
    before = set(multiprocessing.active_children())
    run = ceiling.PlainProcesses(abs, 4, 2, context="fork")
    children = set(multiprocessing.active_children()) - before
    for child in children:  # as a kernel that shuts down, or Ctrl-C in a terminal, does
        os.kill(child.pid, signal.SIGINT)
        child.join(timeout=10)
    assert not any(child.is_alive() for child in children)
    with pytest.raises(RuntimeError, match="plain process 0 of 2 died"):
        run()
    assert run() == 4
    run.close()
    assert "Traceback" not in capfd.readouterr().err


def fail_first_else_wait(index):
    """Work whose index 0 fails at once while the others take a minute."""
    if index == 0:
        raise ValueError("index 0")
    time.sleep(60)


def test_a_failed_call_stops_the_busy_processes_at_once():
    run = ceiling.PlainProcesses(fail_first_else_wait, 2, 2, context="fork")
    children = list(run.children)
    with pytest.raises(RuntimeError, match="plain process 0 of 2 failed"):
        run()
    # the busy one was not waited for: both stopped, and the next call would start new ones
    assert [child.exitcode for child in children] == [-signal.SIGTERM] * 2
    assert run.children == []


def test_no_processes_is_refused():
    with pytest.raises(ValueError, match="at least 1 process"):
        ceiling.PlainProcesses(abs, 4, 0)


def test_plain_runs_names_one_and_many():
    assert list(ceiling.plain_runs(abs, 4, 2)) == ["1 plain process", "2 plain processes"]
    assert list(ceiling.plain_runs(abs, 4, 1)) == ["1 plain process"]


def judged(loader_rates):
    return compare.Comparison(
        {
            "2 workers": loader_rates,
            "1 plain process": [100, 100, 100],
            "2 plain processes": [200, 180, 190],
        }
    )


def test_verdict_gives_what_the_cores_allow_and_the_share_reached():
    allow, share = ceiling.verdict(judged([160, 150, 171]), "2 workers", 2).splitlines()
    assert allow.startswith("the cores this notebook gets allow 1.90× (rounds 1.80× to 2.00×)")
    assert share.startswith("2 workers: 84% of what 2 plain processes reach here")
    assert share.endswith("(rounds 80% to 90%): the workers use most of what the cores allow")


def test_verdict_words_need_every_round_on_one_side():
    assert ceiling.verdict(judged([100, 90, 80]), "2 workers", 2, short="lost").endswith(": lost")
    straddle = ceiling.verdict(judged([160, 90, 80]), "2 workers", 2)
    assert straddle.endswith("no clear verdict: the rounds straddle 60%")


def test_a_share_far_above_the_ceiling_judges_nothing():
    # the loaders do the plain processes' work and more: only a busy machine puts them far above
    above = ceiling.verdict(judged([300, 210, 290]), "2 workers", 2)
    assert above.endswith("above the ceiling: the machine moved; run it again")
    assert ceiling.verdict(judged([205, 180, 200]), "2 workers", 2).endswith("cores allow")


def test_a_median_above_the_ceiling_with_rounds_below_it_is_judged():
    # one core between them: the loader and the plain processes both gain next to nothing, and
    # chance puts the median share above 110% while some rounds are at the ceiling or below it
    busy = on_busy_cores({"2 workers": [125, 118, 100]}, two_plain=(105, 100, 110))
    line = ceiling.verdict(busy, "2 workers", 2).splitlines()[1]
    assert line.startswith("2 workers: 112% of what 2 plain processes reach here")
    assert line.endswith(": the workers use most of what the cores allow")


def test_verdict_judges_each_loader_named():
    comparison = judged([160, 150, 171])
    comparison.rates["webdataset"] = [100, 90, 80]
    lines = ceiling.verdict(comparison, ["2 workers", "webdataset"], 2).splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == ["2 workers", "webdataset"]
    assert lines[2].endswith(": the workers lose much of what the cores allow")


def on_busy_cores(loaders, two_plain=(110, 105, 112)):
    """A comparison where 2 plain processes gain little on 1 (at 100), with ``loaders``' rates."""
    plain = {"1 plain process": [100, 100, 100], "2 plain processes": list(two_plain)}
    return compare.Comparison({**loaders, **plain})


def test_a_loader_slower_than_one_process_keeps_its_verdict_and_is_told_why():
    # the cores allow little (1.1×): 80% of that is still less than one process
    busy = on_busy_cores({"2 workers": [88, 85, 92]})
    allow, line, why = ceiling.verdict(busy, "2 workers", 2).splitlines()
    assert line.startswith("2 workers: 80% of what 2 plain processes reach here")
    assert line.endswith(": the workers use most of what the cores allow")  # as on quiet cores
    assert (
        why == "  2 workers 0.88× of 1 plain process in every round: other programs hold the cores"
    )
    assert len(why) <= 110  # the line a busy machine adds fits a slide's width


def test_loaders_slower_than_one_process_share_one_line_of_why():
    busy = on_busy_cores({"ours": [88, 85, 92], "webdataset": [60, 62, 58]})
    allow, ours, theirs, why = ceiling.verdict(busy, ["ours", "webdataset"], 2).splitlines()
    assert ours.endswith(": the workers use most of what the cores allow")
    assert theirs.endswith(": the workers lose much of what the cores allow")
    assert why == (
        "  ours 0.88×, webdataset 0.60× of 1 plain process in every round: other programs hold "
        "the cores"
    )
    assert len(why) <= 110


def test_a_ceiling_near_one_is_told_even_when_no_loader_is_slower_than_one_process():
    # the plain processes gain 1.05× to 1.2×: the loader's share is judged, and the line says
    # that nothing here could gain much on one process
    busy = on_busy_cores({"2 workers": [105, 110, 112]}, two_plain=(105, 115, 120))
    allow, line, why = ceiling.verdict(busy, "2 workers", 2).splitlines()
    assert line.endswith(": the workers use most of what the cores allow")
    assert why == (
        "  2 plain processes gain under 1.3× on 1 in every round: this notebook has about one "
        "core now"
    )
    assert len(why) <= 110
    assert len(ceiling.verdict(judged([160, 150, 171]), "2 workers", 2).splitlines()) == 2
