"""The test harness's S3 server (tests/support/s3server.py, SeaweedFS) as the product's client
library, obstore, meets it: objects round-trip, a conditional create refuses an existing key,
a wrong secret and a closed port fail with the exceptions the product will see, and a stopped
server leaves nothing behind. What it listens on and what it carries are checked on the
running process."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import obstore
import psutil
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PermissionDeniedError
from obstore.store import S3Store
from support import s3server
from support.controlplane import free_port
from support.leftovers import MARKER_ENV, carriers
from support.s3server import Bucket, S3Server

pytestmark = pytest.mark.unit


def test_objects_round_trip_and_list_by_prefix(s3_bucket: Bucket) -> None:
    store = s3_bucket.store()
    objects = {f"{s3_bucket.prefix}/step-1/model.pt": os.urandom(3000), f"{s3_bucket.prefix}/step-1/meta.json": b"{}"}
    for key, data in objects.items():
        obstore.put(store, key, data)
    obstore.put(store, "elsewhere/x", b"x")

    assert {key: bytes(obstore.get(store, key).bytes()) for key in objects} == objects
    listed = [meta["path"] for meta in obstore.list(store, prefix=f"{s3_bucket.prefix}/step-1").collect()]
    assert sorted(listed) == sorted(objects)
    assert [meta["size"] for meta in obstore.list(store, prefix="elsewhere").collect()] == [1]


def test_create_mode_refuses_an_existing_key_and_leaves_the_object(s3_bucket: Bucket) -> None:
    # What fences a checkpoint commit: the PUT carries If-None-Match: *, the server answers 412.
    store = s3_bucket.store()
    obstore.put(store, "commit", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "commit", b"second", mode="create")
    assert bytes(obstore.get(store, "commit").bytes()) == b"first"


def test_a_wrong_secret_or_no_signature_is_refused(s3_bucket: Bucket) -> None:
    server = s3_bucket.server
    forged = S3Store(
        s3_bucket.name,
        endpoint=server.endpoint,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key + "x",
        region=server.region,
        client_options={"allow_http": True},
    )
    with pytest.raises(PermissionDeniedError, match="SignatureDoesNotMatch"):
        obstore.put(forged, "k", b"forged")
    obstore.put(s3_bucket.store(), "k", b"signed")
    with pytest.raises(PermissionDeniedError, match="SignatureDoesNotMatch"):
        obstore.get(forged, "k")
    unsigned = S3Store(
        s3_bucket.name,
        endpoint=server.endpoint,
        region=server.region,
        skip_signature=True,
        client_options={"allow_http": True},
    )
    with pytest.raises(PermissionDeniedError, match="AccessDenied"):
        obstore.get(unsigned, "k")
    assert bytes(obstore.get(s3_bucket.store(), "k").bytes()) == b"signed"


def test_a_bucket_nobody_created_is_not_created_by_a_put(s3_server: S3Server) -> None:
    # SeaweedFS would create it for an admin (-s3.autoCreateBucket); S3 answers NoSuchBucket.
    # obstore raises the builtin FileNotFoundError for it, not its own NotFoundError.
    with pytest.raises(FileNotFoundError, match="NoSuchBucket"):
        obstore.put(s3_server.store(s3server.unique_bucket_name("never-created")), "k", b"x")


def test_the_environment_it_hands_out_is_what_obstore_signs_with(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_bucket.server.env().items():
        monkeypatch.setenv(name, value)
    # No credentials, no region: S3Store reads AWS_* from the environment.
    store = S3Store(s3_bucket.name, endpoint=s3_bucket.server.endpoint, client_options={"allow_http": True})
    obstore.put(store, "from-env", b"ok")
    assert bytes(obstore.get(s3_bucket.store(), "from-env").bytes()) == b"ok"


def test_a_closed_port_fails_fast_with_a_short_connect_timeout_and_one_retry() -> None:
    store = S3Store(
        "nothing-here",
        endpoint=f"http://127.0.0.1:{free_port()}",
        access_key_id="nobody",
        secret_access_key="nothing",
        region=s3server.REGION,
        client_options={"allow_http": True, "connect_timeout": "1s", "timeout": "2s"},
        retry_config={
            "max_retries": 1,
            "retry_timeout": timedelta(seconds=2),
            "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(milliseconds=200)},
        },
    )
    t0 = time.monotonic()
    # A refused connection is a generic error (no HTTP status to map); measured: 0.1-0.2 s.
    with pytest.raises(GenericError, match="after 1 retries"):
        obstore.put(store, "k", b"x")
    assert time.monotonic() - t0 < 3


def test_it_listens_only_on_its_ip_and_carries_the_session_marker(s3_server: S3Server) -> None:
    assert s3_server.pid is not None
    sockets = psutil.Process(s3_server.pid).net_connections(kind="inet")
    assert {conn.laddr.ip for conn in sockets} == {s3_server.ip}, sockets
    listening = {conn.laddr.port for conn in sockets if conn.status == psutil.CONN_LISTEN}
    assert listening == set(s3_server.ports.values())
    # The leftovers plugin can find it: a crashed session does not leak it.
    assert s3_server.pid in carriers(os.environ[MARKER_ENV])


def test_on_another_ip_it_serves_there_and_adds_only_loopback_listeners(s3_server: S3Server) -> None:
    # The real node's tests give it the bridge IP; 127.0.0.2 is another IP that needs no root.
    with S3Server("127.0.0.2") as server:
        bucket = server.create_bucket("another-ip")
        obstore.put(server.store(bucket), "k", b"v")
        assert bytes(obstore.get(server.store(bucket), "k").bytes()) == b"v"
        assert server.pid is not None
        sockets = psutil.Process(server.pid).net_connections(kind="inet")
    listening = {(conn.laddr.ip, conn.laddr.port) for conn in sockets if conn.status == psutil.CONN_LISTEN}
    assert {port for ip, port in listening if ip == "127.0.0.2"} == set(server.ports.values())
    # SeaweedFS's own: the master, filer and S3 gateway mirror their ports onto loopback.
    mirrored = {server.ports[name] for name in ("master", "master.grpc", "filer", "filer.grpc", "s3", "s3.grpc")}
    assert {port for ip, port in listening if ip == "127.0.0.1"} == mirrored
    assert {ip for ip, _ in listening} == {"127.0.0.2", "127.0.0.1"}


def test_a_stopped_server_leaves_no_process_directory_port_or_socket(s3_server: S3Server) -> None:
    # A second server beside the session's (s3_server also skips the test without `weed`).
    with S3Server() as server:
        pid, workdir, sockets = server.pid, server.workdir, server.grpc_sockets()
        assert pid is not None and psutil.pid_exists(pid)
        assert all(stat.S_ISSOCK(path.stat().st_mode) for path in sockets)
    assert not psutil.pid_exists(pid)
    assert not workdir.exists()
    assert not any(path.exists() for path in sockets)
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect((server.ip, server.ports["s3"]))
    assert server.timings["stop"] < s3server.STOP_GRACE_S + 2


def test_a_failed_start_says_why_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'listen tcp 127.0.0.1:1: bind: address already in use'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"(?s)weed exited with 1.*bind: address already in use"):
        S3Server(weed=fake).start()
    assert [p.name for p in tmp_path.iterdir()] == ["weed"]
