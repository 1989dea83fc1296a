"""Fixtures and hooks: small generated datasets, built once per test session, and the test workers'
threads. Helpers that tests import live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from evaluators.runner.threads import choose_threads
from tests.helpers import make_dataset


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's default) runs one test worker per free core, as `bench evaluate` takes
    torch threads: never more workers than the cores other work leaves free, at least one."""
    return choose_threads().threads


def pytest_configure(config: pytest.Config) -> None:
    """A test worker beside others uses one torch thread: threads that outnumber the free cores
    spin while they wait for each other (a 23 s test took 319 s beside a busy core at two)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_activation_cache(tmp_path_factory):
    """Keep every test's activation cache (and subprocesses') out of the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("BINDINGBENCH_CACHE", str(tmp_path_factory.mktemp("activation-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def balanced_small(tmp_path_factory) -> Path:
    """Paper-shaped balanced ColorShape (8x8, 6 colours, 6 shapes, 18 objects), few scenes."""
    return make_dataset(tmp_path_factory.mktemp("data") / "balanced", n_train=40, n_val=20, n_test=20, shard_size=16)


@pytest.fixture(scope="session")
def uniform_small(tmp_path_factory) -> Path:
    """Uniform ColorShape with overlapping objects allowed (exercises occlusion bookkeeping)."""
    return make_dataset(
        tmp_path_factory.mktemp("data") / "uniform", preset="uniform", n_train=40, n_val=20, n_test=20,
        n_colors=4, n_shapes=4, min_objects=1, max_objects=10, overlap="allow", image_size=64, margin=2,
    )


@pytest.fixture
def one_torch_thread():
    """One torch thread: small probes train faster so, thread sync dominating on 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
