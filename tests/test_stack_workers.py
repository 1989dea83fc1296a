"""A CPU run given several threads fits a backbone's stacks side by side in worker processes
(`evaluators.tasks.binding.workers`): only where that is sooner, with the rows of one process to the
byte, and nothing lost or left running when a worker or the run is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.cli import main
from evaluators.tasks.binding import workers
from tests.helpers import TINY_SCENES, make_dataset

#: Columns that differ between any two runs of the same request.
RUN_COLUMNS = {"run_id", "created_at", "wall_time_s", "command"}
#: Four row sets (two layers x two views): the first fitted in the run's process, three on workers.
REQUEST = ["--model", "random:dinov2-small", "--image-size", "28", "--layers", "0.5,last", "--tokens", "cls,mean",
           "--probes", "linear,dnn", "--epochs", "3"]


@pytest.mark.parametrize("first_s, remaining, n, started, expected", [
    (10.0, 25, 2, False, True),   # a study: 4 s of start-up against 120 s saved
    (0.3, 3, 2, False, False),    # tiny stacks: the start-up costs more than it saves
    (3.0, 4, 2, False, True),     # 4 + 3 * 2 = 10 s on workers against 12 s here
    (3.0, 3, 2, False, False),    # 4 + 3 * 2 = 10 s on workers against 9 s here
    (0.3, 3, 2, True, True),      # workers already running: any two stacks gain
    (0.0, 2, 2, True, True),      # ... even before a stack of this backbone was timed
    (10.0, 1, 2, True, False),    # one stack left: nothing to share
    (10.0, 25, 1, True, False),   # one thread: no workers
])
def test_workers_are_started_only_where_they_finish_sooner(monkeypatch, first_s, remaining, n, started, expected):
    monkeypatch.setattr(workers, "WORKER_START_S", 4.0)
    assert workers.worth_workers(first_s, remaining, n, started) is expected


@pytest.mark.parametrize("free_gib, stack_gib, expected", [(64, 1, 4), (7, 1, 3), (3, 2, 1), (0.5, 0, 1)])
def test_workers_are_as_many_as_the_free_memory_holds(monkeypatch, free_gib, stack_gib, expected):
    """Each worker holds its imports (`WORKER_BYTES`, 1 GiB) and a stack: 4 threads asked."""
    monkeypatch.setattr(workers, "available_memory", lambda: int(free_gib * 2**30))
    assert workers.affordable_workers(4, int(stack_gib * 2**30)) == expected


def rows_of(results: Path) -> list[dict]:
    [path] = results.glob("*.parquet")
    return [{k: v for k, v in r.items() if k not in RUN_COLUMNS} for r in pq.read_table(path).to_pylist()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("workers") / "ds", n_train=48, n_val=16, n_test=16, **TINY_SCENES)


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory) -> list[dict]:
    """The request fitted one stack after another in the run's process (one thread)."""
    tmp = tmp_path_factory.mktemp("one")
    os.environ["BINDINGBENCH_CACHE"] = str(tmp / "cache")
    try:
        assert main(["evaluate", "--dataset", str(data), *REQUEST, "--threads", "1", "--results", str(tmp / "r")]) == 0
    finally:
        del os.environ["BINDINGBENCH_CACHE"]
    return rows_of(tmp / "r")


@pytest.mark.slow
def test_stacks_fitted_on_workers_give_the_rows_of_one_process(data, one_process, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(workers, "WORKER_START_S", 0.0)  # tiny stacks: worth it only with a free start
    assert main(["evaluate", "--dataset", str(data), *REQUEST, "--threads", "2", "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "the other 3 stack(s) side by side on 2 worker processes" in err
    assert rows_of(tmp_path / "r") == one_process and len(one_process) == 8


@pytest.mark.slow
def test_a_later_backbone_goes_to_the_running_workers_whole(data, tmp_path, monkeypatch, capsys):
    """Once the first backbone started the workers, the second's stacks all go to them (none fitted
    in the run's process first), and the rows are those of one process."""
    two = ["--model", "random:dinov2-small-reg", *REQUEST]
    results = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(workers, "WORKER_START_S", 0.0)
        assert main(["evaluate", "--dataset", str(data), *two, "--threads", threads, "--results",
                     str(tmp_path / threads)]) == 0
        results[threads] = rows_of(tmp_path / threads)
    err = capsys.readouterr().err
    assert "random:dinov2-small-reg: the other 3 stack(s) side by side on 2 worker processes" in err
    assert "random:dinov2-small: its 4 stack(s) side by side on 2 worker processes" in err
    assert results["2"] == results["1"] and len(results["1"]) == 16


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_no_rows(data, one_process, tmp_path, monkeypatch, capsys):
    """Every worker is killed (SIGKILL) half a second after the stacks are handed over, while it
    still imports: the stacks go back to the run's process, which says so, and the rows are
    those of one process."""

    class Killed(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            if not hasattr(self, "timer"):
                self.timer = threading.Timer(0.5, lambda: [p.kill() for p in list(self._processes.values())])
                self.timer.start()
            return super().submit(*args, **kwargs)

    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(workers, "WORKER_START_S", 0.0)
    monkeypatch.setattr(workers, "ProcessPoolExecutor", Killed)
    assert main(["evaluate", "--dataset", str(data), *REQUEST, "--threads", "2", "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "a worker process died (killed, or out of memory); the 3 stack(s) not yet back are fitted in this" in err
    assert rows_of(tmp_path / "r") == one_process


KILLED_RUN = """
import sys
from evaluators.tasks.binding import workers
from bench.cli import main
workers.WORKER_START_S = 0.0
main(["evaluate", "--dataset", sys.argv[1], *sys.argv[3:], "--threads", "2", "--results", sys.argv[2]])
"""


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from Linux /proc")
def test_workers_end_when_the_run_is_killed(data, tmp_path):
    """A `kill -9` of the run while its workers fit: they end too (they would otherwise wait on the
    pool's queue for ever), and the results file holds only whole stacks."""
    env = {**os.environ, "BINDINGBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(data), str(tmp_path / "r"), *REQUEST], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # a hang guard: the workers start in seconds
    while len(workers_of := [p for p in children(run.pid) if _is_worker(p)]) < 2:
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before its workers started"
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers_of):
        assert time.monotonic() < deadline, "workers still running 30 s after the run was killed"
        time.sleep(0.1)
    for path in (tmp_path / "r").glob("*.parquet"):  # whatever was written is whole stacks of rows
        assert pq.read_table(path).num_rows % 2 == 0


def _is_worker(pid: int) -> bool:
    """A spawned worker (not multiprocessing's resource tracker)."""
    try:
        return "spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
