"""`hexir tune --ray-address` as a user meets it: joining a cluster that `ray start` runs, its
measurements recorded in the database (on a cluster of two nodes, measured on both, each under
its node's target key); and an address where no cluster listens refused at once, in one
paragraph, by the command and by RayExecutor alike."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from cli_helpers import run_hexir

from hexir.database import Database
from hexir.errors import MeasureError
from hexir.runtime.target import host_key
from hexir.search.distributed import RayExecutor

WORKLOAD = "matmul:M=32,N=32,K=32"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, Path]]:
    """A cluster of two CPUs that `ray start --head --block` runs, as a user starts one: its
    address and its temp folder."""
    with cluster_folder() as folder:
        port = free_port()
        address = f"{ray.util.get_node_ip_address()}:{port}"
        with ray_node(folder, "head", "--head", f"--port={port}", "--num-cpus=2"):
            yield address, folder
    assert not answers(address), "the cluster outlived its test"


@contextlib.contextmanager
def cluster_folder() -> Iterator[Path]:
    """A new temp folder for a cluster, with the token it asks for; removed on exit."""
    folder = Path(tempfile.mkdtemp(prefix="hexir-ray-"))  # short: Ray's sockets live in it
    try:
        # Whether `ray start` asks for a token by default changed between Ray releases (2.5x
        # did, 2.60 does only where ~/.ray/auth_token exists): these clusters ask, always.
        (folder / "auth_token").write_text(secrets.token_hex(32))
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def ray_node(folder: Path, name: str, *options: str) -> Iterator[None]:
    """A node that `ray start OPTIONS --block` runs with the cluster's temp folder and token,
    its output in NAME.log there, once it says it runs. It runs in a session of its own, and
    ends as a user ends it, with Ctrl-C (then SIGKILL for anything of its process group still
    there). Its dashboard agent listens on a free port, not on Ray's fixed default (52365),
    which another node of this machine may hold; Ray picks its other ports itself."""
    log = folder / f"{name}.log"
    command = [
        str(Path(sys.executable).with_name("ray")), "start", *options,
        f"--dashboard-agent-listen-port={free_port()}", "--object-store-memory=100000000",
        "--disable-usage-stats", f"--temp-dir={folder}", "--block",
    ]  # fmt: skip
    if "--head" in options:
        command.insert(-1, "--include-dashboard=false")
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **token_env(folder / "auth_token")},
        )
    try:
        started(proc, log)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def token_env(token: Path) -> dict[str, str]:
    """The environment that makes Ray ask for (a cluster) or send (a driver) the token in a file."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def started(proc: subprocess.Popen, log: Path) -> None:
    """Wait until `ray start` says the cluster runs (120 s at most)."""
    deadline = time.monotonic() + 120.0
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None, f"ray start ended:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"ray start did not finish:\n{log.read_text()}"
        time.sleep(0.2)


def tune_joining(
    folder: Path, address: str, name: str, *more: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, str]:
    """`hexir tune` of WORKLOAD, 4 trials, joining the cluster at `address`, into the new
    database `name` in `folder`: the finished command and the database's URL."""
    url = f"sqlite:///{folder / name}"
    done = run_hexir(
        folder, "tune", WORKLOAD, "--trials", "4", "--target", "cpu", "--db", url,
        "--ray-address", address, *more, timeout=timeout,
    )  # fmt: skip
    return done, url


def drivers(folder: Path) -> list[Path]:
    """The logs of the drivers (the `ray.init` callers) that joined the cluster."""
    return list(folder.glob("session_latest/logs/python-core-driver-*.log"))


@pytest.mark.slow
@pytest.mark.serial
def test_tune_joins_a_running_cluster_and_records_its_measurements(head, tmp_path, monkeypatch):
    address, folder = head
    assert drivers(folder) == []
    # The cluster asks for its token, which Ray sends to an address that is given (not found,
    # as "auto" is) only where RAY_AUTH_MODE says so.
    for name, value in token_env(folder / "auth_token").items():
        monkeypatch.setenv(name, value)
    done, url = tune_joining(tmp_path, address, "joined.db", "--seed", "0", "--report", "json")
    assert done.returncode == 0, done.stderr
    (task,) = json.loads(done.stdout)["tasks"]
    assert task["trials"] == 4 and task["best_latency"] is not None
    records = Database(url).records(task["workload_key"], "cpu")
    assert len({r.candidate_key for r in records}) == len(records) == 4
    assert min(r.median for r in records if r.is_valid) == task["best_latency"]
    assert len(drivers(folder)) == 1  # the tune ran on this cluster, not on one of its own
    assert answers(address)  # and left it running


@pytest.mark.slow
@pytest.mark.serial
def test_a_tune_on_two_nodes_of_this_machine_measures_on_both_under_their_key(
    tmp_path, monkeypatch
):
    # Two nodes of one CPU each, started as on two machines: the tune's runners (one per
    # node) time its candidates on both, and each record is stored under the key that the
    # node which timed it probed for itself (one machine here, so one key: the driver's).
    with cluster_folder() as folder:
        for name, value in token_env(folder / "auth_token").items():
            monkeypatch.setenv(name, value)
        port = free_port()
        address = f"{ray.util.get_node_ip_address()}:{port}"
        with (
            ray_node(folder, "head", "--head", f"--port={port}", "--num-cpus=1"),
            ray_node(folder, "worker", f"--address={address}", "--num-cpus=1"),
        ):
            nodes = alive_nodes(address, 2)
            done, url = tune_joining(tmp_path, address, "two.db", "--seed", "0", "--report", "json")
    assert not answers(address), "the cluster outlived its test"
    assert len(nodes) == 2, nodes
    assert done.returncode == 0, done.stderr
    (task,) = json.loads(done.stdout)["tasks"]
    assert Database(url).stats().targets == {host_key("cpu"): 4}
    records = Database(url).records(task["workload_key"], "cpu")
    assert {r.build_info["run_node_id"] for r in records} == nodes
    assert all(r.build_info["run_target_key"] == r.target_key for r in records)


def alive_nodes(address: str, count: int) -> set[str]:
    """The ids of the nodes `ray status` lists as alive once it lists `count` (60 s at most):
    the autoscaler's view, which takes a few seconds to catch up with a node that joined."""
    deadline = time.monotonic() + 60.0
    ray_command = str(Path(sys.executable).with_name("ray"))
    while True:
        status = subprocess.run(
            [ray_command, "status", f"--address={address}"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        nodes = set(re.findall(r"^\s*1 node_([0-9a-f]+)\s*$", status, re.MULTILINE))
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token", None])
@pytest.mark.serial
def test_a_cluster_that_asks_for_a_token_this_driver_lacks_is_one_paragraph(
    head, tmp_path, monkeypatch, mode
):
    address, _ = head
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token either
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        # Refused, the driver tries the cluster again once a second, 20 times by default:
        # three tries say the same.
        monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "3")
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    done, url = tune_joining(tmp_path, address, "refused.db", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    # Ray's C++ client logs its refused tries (it retries for 20 s) before hexir's paragraph.
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hexir: error: could not join '{address}'"), done.stderr
    assert "RAY_AUTH_TOKEN_PATH" in last if mode else "RAY_AUTH_MODE=token" in last
    assert Database(url).stats().records == 0


def test_an_address_where_no_cluster_listens_is_one_paragraph(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    done, url = tune_joining(tmp_path, address, "none.db", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"hexir: error: could not join '{address}': nothing answers")
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0
    assert Database(url).stats().records == 0


@pytest.mark.parametrize("form", ["127.0.0.1:{}", "localhost:{}", "ray://127.0.0.1:{}"])
def test_ray_executor_refuses_an_address_where_no_cluster_listens(form):
    if ray.is_initialized():  # a connection left by another module would be used instead
        ray.shutdown()
    address = form.format(free_port())
    with pytest.raises(MeasureError, match="nothing answers at .*Connection refused") as info:
        RayExecutor("cpu", address=address)
    assert f"could not join {address!r}" in str(info.value) and "`ray status`" in str(info.value)
    assert not ray.is_initialized()
