"""One local Ray cluster for the session, shared by the tests that run engine replicas
(tests/test_replicas.py, tests/test_bench_replicas.py): `ray start` once, not per module or
per target. Each user leaves it as it found it: the replicas its gateways created removed.

Importing this file imports no Ray (conftest.py imports it for `make test-fast` too).
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER and RAY_AUTH_MODE: set in conftest.py, before vLLM imports
Ray; `ray start` inherits them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from clients import wait_for
from serving import free_port

RAY_CPUS = 2  # the replicas' tests deploy 2 replicas of one CPU each; the bench, 1 or 2


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """`ray start --head --block` on loopback in a process group of its own, ended by its id."""
    from gateway_bench.replica_bench import ray_start  # the bench's clusters are started so

    port = free_port()
    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    args, env = ray_start(port, temp, RAY_CPUS)
    process = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: process.poll() is not None or _listening(port))
        assert process.poll() is None, "ray start exited"
        yield f"127.0.0.1:{port}"
    finally:
        import ray as ray_api

        ray_api.shutdown()  # this process's connection, if it joined (a gateway, the bench)
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()
        shutil.rmtree(temp, ignore_errors=True)


def remove_replicas(count: int) -> None:
    """The replicas a gateway left on the session's cluster (this process joined it), ended."""
    from gateway.engine.replicas import remove_replicas as remove

    remove(count)
