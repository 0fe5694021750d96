"""Real servers for the tests, on 127.0.0.1: PostgreSQL (Debian's package), moto's S3-compatible
object store, `mlflow server` (directly or through scripts/tracking_server.sh), and a proxy that
kills the server it fronts mid-run. Each is a context manager that stops what it started.

PostgreSQL refuses to run as root, so as root the cluster is created and run as the `postgres`
user in a folder outside pytest's root-only tmp tree.
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

REQUIRE_ENV = "VLAEVAL_REQUIRE_SYSTEM_PACKAGES"  # set by .ci/run: a missing package fails, not skips
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def need(condition: bool, what: str) -> None:
    """Skip locally when a system package is missing; in CI (REQUIRE_ENV set) fail instead."""
    if condition:
        return
    message = f"{what} is not installed: `make test` installs it with apt-get when run as root"
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(message)
    pytest.skip(message)


def osmesa_installed() -> bool:
    """OSMesa, the library MuJoCo renders cameras with on the CPU (MUJOCO_GL=osmesa)."""
    import ctypes.util

    return ctypes.util.find_library("OSMesa") is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, process: Optional[subprocess.Popen] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}")
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(0.25)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def postgres_bindir() -> Optional[Path]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_postgres_user(args: List[str]) -> List[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A throw-away PostgreSQL cluster with database `mlflow`; yields its SQLAlchemy URI."""
    bindir = postgres_bindir()
    need(bindir is not None, "PostgreSQL (Debian package postgresql)")
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="vlaeval-pg-"))
    data, port = root / "data", free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    try:
        subprocess.run(
            _as_postgres_user([str(bindir / "initdb"), "-D", str(data), "-U", "vlaeval", "--auth=trust", "-E", "UTF8"]),
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            _as_postgres_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    f"-h 127.0.0.1 -p {port} -k {root}",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "vlaeval", "mlflow"],
            check=True,
            capture_output=True,
            text=True,
        )
        yield f"postgresql://vlaeval@127.0.0.1:{port}/mlflow"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                _as_postgres_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                capture_output=True,
            )
        shutil.rmtree(root, ignore_errors=True)


class S3Server:
    """moto's S3-compatible server with one bucket; .env is what a client of it needs."""

    def __init__(self, bucket: str, log_path: Path) -> None:
        self.bucket, self.log_path, self.port = bucket, log_path, free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "vlaeval-test",
            "AWS_SECRET_ACCESS_KEY": "vlaeval-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.process: Optional[subprocess.Popen] = None

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )

    def keys(self) -> List[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def __enter__(self) -> "S3Server":
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: urllib.request.urlopen(self.endpoint, timeout=2).status == 200,
            60,
            f"moto S3 server on {self.endpoint}",
            self.process,
        )
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        self._log.close()


class MlflowServer:
    """`mlflow server` with proxied artifacts on 127.0.0.1; .uri is its tracking URI. With
    script=True it is started through the shipped scripts/tracking_server.sh; `env` is added to
    the server's environment only (S3 credentials stay with the server, as in production)."""

    def __init__(
        self,
        backend_uri: str,
        artifacts,
        log_path: Path,
        port: Optional[int] = None,
        *,
        script: bool = False,
        env: Optional[dict] = None,
    ) -> None:
        self.backend_uri, self.artifacts, self.log_path = backend_uri, artifacts, log_path
        self.script, self.extra_env = script, dict(env or {})
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 240) -> "MlflowServer":
        mlflow = Path(sys.executable).with_name("mlflow")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(self.extra_env)
        if self.script:
            env.update(
                {
                    "MLFLOW": str(mlflow),
                    "VLAEVAL_BACKEND_STORE_URI": self.backend_uri,
                    "VLAEVAL_ARTIFACTS_DESTINATION": str(self.artifacts),
                    "VLAEVAL_SERVER_HOST": "127.0.0.1",
                    "VLAEVAL_SERVER_PORT": str(self.port),
                    "VLAEVAL_SERVER_WORKERS": "1",
                }
            )
            command = [str(Path(__file__).resolve().parents[2] / "scripts" / "tracking_server.sh")]
        else:
            command = [
                str(mlflow),
                "server",
                "--backend-store-uri",
                self.backend_uri,
                "--serve-artifacts",
                "--artifacts-destination",
                str(self.artifacts),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
            ]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        wait_until(
            lambda: urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200,
            timeout,
            f"mlflow server on {self.uri} (log: {self.log_path})",
            self.process,
        )
        return self

    def kill(self) -> None:
        """SIGKILL the whole server (uvicorn and its workers): a crash, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "MlflowServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class KillingProxy:
    """An HTTP proxy in front of an MLflow server that SIGKILLs the server when the first
    request whose path contains `trigger` arrives (the run exists by then, half logged) and drops
    that connection unanswered: the client sees the server die mid-run, deterministically."""

    def __init__(self, server: MlflowServer, trigger: str = "/runs/log-batch") -> None:
        self.server, self.trigger, self.killed = server, trigger, threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                if proxy.trigger in self.path:
                    proxy.server.kill()
                    proxy.killed.set()
                if proxy.killed.is_set():
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.server.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                payload = reply.read()
                self.send_response(reply.status)
                for key, value in reply.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "KillingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
