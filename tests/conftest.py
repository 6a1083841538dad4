"""Shared test fixtures: one local gloo cluster per world size, kept alive for the session.

Spawning a rank costs about a second, so every test that needs real processes asks
``clusters(world)`` and gets the same live cluster back; a cluster that a failing test
brought down is relaunched on the next request.
"""
from __future__ import annotations

import os

import pytest

import ringcoll

#: the world sizes of the real gloo clusters the built-in comparison tests run at (the
#: simulator's are tests/_util.py's SIM_WORLDS)
GLOO_WORLDS = (1, 2, 3, 4, 5, 8)


def pytest_addoption(parser):
    parser.addoption("--transport", choices=("auto", "host", "batched"),
                     default=os.environ.get("RINGCOLL_TEST_TRANSPORT", "auto"),
                     help="the executor transport every rank of every cluster uses: 'batched' runs the "
                          "catalogue through the NCCL-shaped transport and its shim on gloo "
                          "(RINGCOLL_TRANSPORT in the ranks; default from RINGCOLL_TEST_TRANSPORT)")


def pytest_configure(config):
    # the schedule and simulator tests cut small data into many segments (RINGCOLL_SEGMENT down
    # to 8 bytes), below the floor a user's setting must clear (ringcoll.config.SEGMENT_FLOOR);
    # the floor's own tests set it explicitly. Spawned ranks inherit it.
    os.environ.setdefault("RINGCOLL_SEGMENT_FLOOR", "1")
    transport = config.getoption("transport")
    if transport != "auto":             # spawned ranks inherit it, whoever launches them
        os.environ["RINGCOLL_TRANSPORT"] = transport


class Clusters:
    def __init__(self):
        self._live: dict[int, ringcoll.launch] = {}

    def __call__(self, world: int):
        cluster = self._live.get(world)
        if cluster is None or not cluster.alive:
            cluster = ringcoll.launch(world, "gloo", timeout=float(os.environ.get("RINGCOLL_TEST_TIMEOUT", 120)),
                                      threads=1, env={"RINGCOLL_TIMEOUT": "60"})
            self._live[world] = cluster
        return cluster

    def close(self):
        for cluster in self._live.values():
            cluster.close()
        self._live.clear()


@pytest.fixture(scope="session")
def clusters():
    pool = Clusters()
    yield pool
    pool.close()


@pytest.fixture
def plain_env(monkeypatch):
    """No setting that steers ``auto`` (RINGCOLL_ALGO, _TUNING, _MACHINE, _LOCAL_SIZE, _SEGMENT,
    torchrun's LOCAL_WORLD_SIZE) and a cold model cache, for tests of what ``auto`` picks."""
    from ringcoll import selection

    for name in ("RINGCOLL_ALGO", "RINGCOLL_TUNING", "RINGCOLL_MACHINE", "RINGCOLL_LOCAL_SIZE",
                 "LOCAL_WORLD_SIZE", "RINGCOLL_SEGMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(selection.model, "_simulated", {})
    return monkeypatch
