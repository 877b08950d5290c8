"""A real `redis-server` (Debian's) on a free loopback port, with no persistence.

`deploy/install.sh` installs it where it is missing. `stop()` makes Redis unreachable while
the port stays the server's, so `start()` brings the same address back (empty: nothing is
saved).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from clients import wait_for
from serving import free_port


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: apt-get install -y redis-server"
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="llm-gateway-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        self.client = redis.Redis.from_url(self.url)

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
        self._process = subprocess.Popen([self.binary, *args], stdout=subprocess.DEVNULL)
        wait_for(self._answers)

    def _answers(self) -> bool:
        assert self._process is not None and self._process.poll() is None, "redis-server exited"
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP / SIGCONT: Redis keeps its connections but answers nothing meanwhile."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        self.client.connection_pool.disconnect()


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)
