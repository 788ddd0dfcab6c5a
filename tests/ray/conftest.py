"""A real Ray cluster on 127.0.0.1 for the tests marked ``ray``: a head node and one worker node,
each started by ``ray start`` as its own raylet with 1 CPU and one unit of the custom resource
``bmoe_flash`` (as two machines with one flash device each would look). Started once per test
session in its own temp folder, stopped at the end: every process whose command line names that
folder, and their descendants, are ended, so a Ray of anyone else on the machine is left alone (no
``ray stop``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.rows import FLASH

START_TIMEOUT_S = 120


@dataclass(frozen=True)
class LocalCluster:
    address: str  # the head's GCS, host:port
    temp_dir: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> None:
    ray = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray,
        "start",
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "1",
        "--resources",
        f'{{"{FLASH}": 1}}',
        "--disable-usage-stats",
        *args,
    ]
    with open(log, "ab") as out:
        done = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=START_TIMEOUT_S)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"ray start {' '.join(args[:2])} failed ({done.returncode}):\n" + "\n".join(tail))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process that can be read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmdline)
    return out


def _stop(cluster: LocalCluster) -> None:
    """End this cluster's processes: those whose command line names its temp folder (the GCS, the
    raylets, the monitors) or its GCS address (the Ray client server), and all their descendants,
    found before any is ended (Ray's agents and workers rename themselves, so only their parentage
    says whose they are)."""
    gcs = re.compile(rf"address=\S+:{cluster.address.rsplit(':', 1)[1]}\b")
    for _ in range(2):
        procs = _processes()
        mine = {
            pid
            for pid, (_, cmd) in procs.items()
            if (str(cluster.temp_dir) in cmd or gcs.search(cmd)) and pid != os.getpid()
        }
        grew = True
        while grew:
            more = {pid for pid, (ppid, _) in procs.items() if ppid in mine and pid not in mine}
            mine |= more
            grew = bool(more)
        for pid in mine:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.5)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    import ray

    # Ray's socket paths must stay under 107 bytes: a short folder of its own, not pytest's (whose
    # path grows with the run number and, on xdist workers, the worker's name).
    temp = Path(tempfile.mkdtemp(prefix="bmoe-ray-", dir="/tmp"))
    # Token auth is for clusters reachable by others; this one listens on loopback for this test
    # only, and its processes and this driver must agree on the mode.
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = dict(os.environ)
    cluster = LocalCluster(f"127.0.0.1:{_free_port()}", temp)
    address = cluster.address
    try:
        _ray_start(
            [
                "--head",
                "--port",
                address.split(":")[1],
                "--temp-dir",
                str(temp),
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(_free_port()),
            ],
            env,
            temp / "start.log",
        )
        _ray_start(["--address", address], env, temp / "start.log")
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop(cluster)
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
        shutil.rmtree(temp, ignore_errors=True)
