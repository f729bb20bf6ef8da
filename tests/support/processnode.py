"""A test-only node that runs pods as local processes: no containers, no images.

It registers a Node, binds the unscheduled pods of the namespaces it serves (playing the
scheduler), starts each container's `command + args` with the pod's env, and reports real
status back through the API server: Running with a podIP of its own, then each container's
real exit code, phase Succeeded or Failed. Deleting a pod terminates its processes, reports
how they ended and confirms the deletion, once, as a kubelet does (a pod held by a finalizer
stays Terminating meanwhile); with `remove_deleted_logs` their logs go at once too. Its
processes' output is the pods' log through the API server (`pods/log`, followed too:
support.kubelet_logs.LogServer), so the operator reads rank 0's progress, keeps the logs of
deleted pods, and `kubetrain logs` works. So a test can go apply -> operator -> pods ->
training -> Succeeded on one machine.

What a container would isolate is shared here, so three things are translated:
- every pod has the node's loopback: env values that are in-cluster DNS names
  (`*.svc`, `*.svc.<domain>`) become 127.0.0.1; pods of one job must use distinct ports,
  except where a process binds its pod's own IP: each pod's IP is an address of its own in
  127.0.0.0/8 (status.podIP, and its fieldRef), which the in-place restart's agent listens on
  (its readiness probe and the operator's orders, as on a cluster);
- volume mount paths are rewritten, in command, args and env values, to host directories
  under the node's workdir: one per PersistentVolumeClaim (shared by the pods that mount it)
  and one per pod for every other volume; a ConfigMap volume's directory holds its keys as
  files, and a pod whose ConfigMap does not exist yet waits (as a kubelet's mount does);
- the image is ignored: executables come from PATH with this interpreter's bin dir first, and
  kubetrain's torchrun hooks load in every Python as the trainer image's .pth loads them
  (PYTHONPATH starts with the sitecustomize `kubetrain run --local` uses).
Init containers run first, one after another. restartPolicy is treated as Never. A tcpSocket or
httpGet readiness probe of the pod's IP is tried every poll (0.2 s) and sets Ready; a downward
API volume's files of `metadata.labels[...]`/`metadata.annotations[...]` are written at start and
rewritten when the pod's labels change (a kubelet does within a second; with
`refresh_downward_api=False` never, as a kubelet that is late without bound).

    with ProcessNode(control_plane.api_client, namespaces=[ns], workdir=tmp_path) as node:
        ...create pods or a TrainingJob...
        node.logs(ns, "job-node-0")   # stdout+stderr of its first container
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from kubetrain.local.localize import SITE_DIR, expand
from kubetrain.local.processes import ProcessTree, note_groups, stop, subreaper

from .kubelet import node_manifest as _node_manifest
from .kubelet import now
from .kubelet_logs import ContainerRemoved, LogServer

IN_CLUSTER_HOST = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.svc(\.[a-z0-9.-]+)?$")
HEARTBEAT_S = 10.0
POLL_S = 0.2
NOTE_GROUPS_EVERY_S = 1.0
TERMINATION_LOG_LINES = 40


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    workdir: Path
    grace: float
    fallback_to_logs: dict[str, bool]
    procs: dict[str, ProcessTree] = field(default_factory=dict)
    # Where this pod's output starts in <container>.log: a pod re-created under the same name
    # (a gang restart) appends to the same file, and its log starts there.
    log_offsets: dict[str, int] = field(default_factory=dict)
    started: str = ""
    phase: str = "Pending"
    stopping: bool = False
    ip: str = "127.0.0.1"
    probe: tuple[int, str | None] | None = None  # a readiness probe's port, and its HTTP path (None: tcpSocket)
    ready: bool = False
    ready_at: str = ""
    projected: dict[Path, str] = field(default_factory=dict)  # downward API file -> what it holds


class _NotReady(Exception):
    """A pod that cannot start yet (its ConfigMap is missing): tried again on the next sync."""


class ProcessNode:
    def __init__(
        self,
        new_api_client: Callable[[], Any],
        *,
        namespaces: Iterable[str],
        workdir: Path,
        node_name: str = "kubetrain-process-node",
        extra_env: dict[str, str] | None = None,
        remove_deleted_logs: bool = False,
        no_log_once_deleted: bool = False,
        refresh_downward_api: bool = True,
    ) -> None:
        self.api = new_api_client()
        self.core = client.CoreV1Api(self.api)
        self.namespaces = list(namespaces)
        self.workdir = Path(workdir)
        self.node_name = node_name
        self.extra_env = extra_env or {}
        # As a real kubelet does: a deleted pod's containers, and their logs, are removed as soon
        # as they have stopped (before their status reaches anyone). Streams already open go on.
        self.remove_deleted_logs = remove_deleted_logs
        # The harshest kubelet: a log asked for once its pod is being deleted gets the answer of
        # a removed container (200, one line: ContainerRemoved); only a stream opened before the
        # delete goes on.
        self.no_log_once_deleted = no_log_once_deleted
        self.refresh_downward_api = refresh_downward_api
        self._ips = 0
        self.pods: dict[str, _Pod] = {}
        self.deleted: set[str] = set()  # uids whose deletion this node has confirmed
        self._named: dict[tuple[str, str], _Pod] = {}  # the newest pod of each (namespace, name)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"process-node-{node_name}", daemon=True)
        self._last_heartbeat = 0.0
        self._groups_noted = 0.0
        self._cleanup = contextlib.ExitStack()
        self.log_server = LogServer(self.core, node_name, self.workdir, self._read_log)

    # --- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> ProcessNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._register()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_server.start()
        self._cleanup.callback(self.log_server.stop)
        # Workers orphaned by a killed torchrun come back to this process, where stop() finds them.
        self._cleanup.enter_context(subreaper())
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and kill every process this node started."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for pod in self.pods.values():
            self._kill(pod, grace=2)
        self._cleanup.close()
        self.api.close()

    def ensure_node(self) -> None:
        """The Node object exists from `start` on (support/kubelet_logs.py serves its pods' logs)."""

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        pod_dir = self.workdir / "pods" / namespace / name
        files = sorted(pod_dir.glob("*.log")) if container is None else [pod_dir / f"{container}.log"]
        return "".join(f.read_text(errors="replace") for f in files if f.exists())

    # --- the node ------------------------------------------------------------------------
    def _register(self) -> None:
        with contextlib.suppress(client.ApiException):
            manifest = _node_manifest(self.node_name)
            manifest["metadata"]["labels"]["kubetrain.dev/process-node"] = "true"
            self.core.create_node(manifest)
        self._heartbeat()

    def _heartbeat(self) -> None:
        # Without heartbeats the node-lifecycle controller marks the node unreachable and,
        # after the default 300 s toleration, evicts its pods.
        stamp = now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubetrain ProcessNode",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        # Only the InternalIP: the API server reaches the log server through a Hostname address first.
        addresses = [{"$patch": "replace"}, {"type": "InternalIP", "address": "127.0.0.1"}]
        self.core.patch_node_status(self.node_name, {"status": {"conditions": [ready], "addresses": addresses}})
        self._last_heartbeat = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._last_heartbeat > HEARTBEAT_S:
                    self._heartbeat()
                for namespace in self.namespaces:
                    self._sync(namespace)
                if time.monotonic() - self._groups_noted > NOTE_GROUPS_EVERY_S:
                    # While torchrun lives: afterwards its workers are no longer its descendants.
                    note_groups([tree for pod in self.pods.values() for tree in pod.procs.values()])
                    self._groups_noted = time.monotonic()
            except Exception as exc:  # a test reads these; the loop must outlive one bad pod
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(POLL_S)

    def _sync(self, namespace: str) -> None:
        seen = set()
        for pod in self.core.list_namespaced_pod(namespace).items:
            uid = pod.metadata.uid
            seen.add(uid)
            if not pod.spec.node_name:
                if pod.metadata.deletion_timestamp is None and pod.spec.scheduler_name in (None, "default-scheduler"):
                    self._bind(pod)
                continue
            if pod.spec.node_name != self.node_name:
                continue
            state = self.pods.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                # Once: a pod held by a finalizer stays, Terminating, after the kubelet is done.
                if uid not in self.deleted:
                    if state is not None:
                        self._kill(state, grace=state.grace)
                        if self.remove_deleted_logs:
                            for name in state.procs:
                                (state.workdir / f"{name}.log").unlink(missing_ok=True)
                        self._stopped(state)
                    self._confirm_deletion(pod)
                    self.deleted.add(uid)
            elif state is None and pod.status.phase in (None, "Pending"):
                self._launch(pod)
            elif state is not None and state.phase == "Running":
                if self.refresh_downward_api:
                    self._project(pod, state)
                self._reap(state)
                if state.phase == "Running":
                    self._probe(state)
        for uid in set(self.pods) - seen:
            self._kill(self.pods.pop(uid), grace=0)

    def _bind(self, pod: Any) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.metadata.name, "uid": pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.core.create_namespaced_binding(pod.metadata.namespace, body, _preload_content=False)
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # deleted meanwhile, or already bound
                raise

    def _confirm_deletion(self, pod: Any) -> None:
        with contextlib.suppress(client.ApiException):
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                # With a body the server reads the options from it, not from query parameters.
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                ),
            )

    # --- running containers --------------------------------------------------------------
    def _launch(self, pod: Any) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        pod_dir = self.workdir / "pods" / ns / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        try:
            mounts = self._volume_dirs(pod, pod_dir)
        except _NotReady:
            return
        state = _Pod(
            namespace=ns,
            name=name,
            uid=pod.metadata.uid,
            workdir=pod_dir,
            grace=float(min(pod.spec.termination_grace_period_seconds or 30, 10)),
            fallback_to_logs={
                c.name: c.termination_message_policy == "FallbackToLogsOnError" for c in pod.spec.containers
            },
        )
        self.pods[state.uid] = state
        self._named[(ns, name)] = state
        state.started = now()
        state.ready_at = state.started
        state.ip = self._next_ip()
        state.probe = self._readiness_probe(pod)
        self._project(pod, state)
        for init in pod.spec.init_containers or []:
            code = self._spawn(pod, init, mounts, state).proc.wait()
            if code != 0:
                state.phase = "Failed"
                self._report(state, init_failed=(init.name, code))
                return
        for container in pod.spec.containers:
            self._spawn(pod, container, mounts, state)
        state.phase = "Running"
        self._report(state)

    def _volume_dirs(self, pod: Any, pod_dir: Path) -> dict[str, Path]:
        """mountPath -> host directory, for every volume mount of every container."""
        by_volume: dict[str, Path] = {}
        for volume in pod.spec.volumes or []:
            if volume.persistent_volume_claim is not None:
                host = self.workdir / "pvc" / pod.metadata.namespace / volume.persistent_volume_claim.claim_name
            else:
                host = pod_dir / "volumes" / volume.name
            host.mkdir(parents=True, exist_ok=True)
            if volume.config_map is not None:
                self._write_config_map(pod.metadata.namespace, volume.config_map, host)
            by_volume[volume.name] = host
        mounts: dict[str, Path] = {}
        for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
            for mount in container.volume_mounts or []:
                if mount.name in by_volume:
                    mounts[mount.mount_path.rstrip("/")] = by_volume[mount.name]
        return mounts

    def _write_config_map(self, namespace: str, source: Any, host: Path) -> None:
        """The ConfigMap's keys (or its `items`) as files; _NotReady while it does not exist."""
        try:
            data = self.core.read_namespaced_config_map(source.name, namespace).data or {}
        except client.ApiException as exc:
            if exc.status == 404 and not source.optional:
                raise _NotReady(f"configmap {source.name}") from None
            if exc.status != 404:
                raise
            data = {}
        paths = {item.key: item.path for item in source.items or []} or {key: key for key in data}
        for key, path in paths.items():
            (host / path).parent.mkdir(parents=True, exist_ok=True)
            (host / path).write_text(data[key])

    def _next_ip(self) -> str:
        """An address of 127.0.0.0/8 for the next pod (the whole block is loopback on Linux)."""
        self._ips += 1
        return f"127.42.{self._ips // 250 % 250}.{self._ips % 250 + 2}"

    @staticmethod
    def _readiness_probe(pod: Any) -> tuple[int, str | None] | None:
        """The port (a container port's name resolved) and HTTP path of the pod's readiness probe."""
        for container in pod.spec.containers:
            probe = container.readiness_probe
            action = probe and (probe.http_get or probe.tcp_socket)
            if action is None:
                continue
            named = {p.name: p.container_port for p in container.ports or []}
            port = named.get(action.port, action.port)
            return int(port), (probe.http_get.path or "/") if probe.http_get is not None else None
        return None

    def _project(self, pod: Any, state: _Pod) -> None:
        """Write (or rewrite) the downward API volumes' label and annotation files, atomically."""
        meta = pod.metadata
        for volume in pod.spec.volumes or []:
            if volume.downward_api is None:
                continue
            for item in volume.downward_api.items or []:
                match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", item.field_ref.field_path or "")
                if match is None:
                    continue
                value = str((getattr(meta, match.group(1)) or {}).get(match.group(2), ""))
                path = state.workdir / "volumes" / volume.name / item.path
                if state.projected.get(path) == value:
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                temporary = path.with_name(f".{path.name}.tmp")
                temporary.write_text(value)
                os.replace(temporary, path)
                state.projected[path] = value

    def _probe(self, state: _Pod) -> None:
        if state.probe is None:
            return
        port, path = state.probe
        try:
            with socket.create_connection((state.ip, port), timeout=0.5) as sock:
                if path is None:
                    ready = True
                else:  # as a kubelet's httpGet probe: any 2xx or 3xx answer
                    sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {state.ip}\r\n\r\n".encode())
                    answer = sock.recv(64).decode(errors="replace").split()
                    ready = len(answer) > 1 and answer[1][:1] in ("2", "3")
        except OSError:
            ready = False
        if ready != state.ready:
            state.ready, state.ready_at = ready, now()
            self._report(state)

    @staticmethod
    def _rewrite(value: str, mounts: dict[str, Path]) -> str:
        if IN_CLUSTER_HOST.match(value):
            return "127.0.0.1"
        for mount_path, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            value = re.sub(rf"(?<![\w/]){re.escape(mount_path)}(?=/|\b|$)", str(host), value)
        return value

    def _env(self, pod: Any, container: Any, mounts: dict[str, Path]) -> dict[str, str]:
        ns = pod.metadata.namespace
        env: dict[str, str] = {}
        for source in container.env_from or []:
            prefix = source.prefix or ""
            if source.config_map_ref is not None:
                data = self.core.read_namespaced_config_map(source.config_map_ref.name, ns).data or {}
                env.update({prefix + k: v for k, v in data.items()})
            if source.secret_ref is not None:
                data = self.core.read_namespaced_secret(source.secret_ref.name, ns).data or {}
                env.update({prefix + k: base64.b64decode(v).decode() for k, v in data.items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = expand(var.value or "", env)
            else:
                env[var.name] = self._value_from(pod, var.value_from)
        env = {k: self._rewrite(v, mounts) for k, v in env.items()}
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        python_path = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
        base = {**os.environ, "PATH": path, "HOSTNAME": pod.metadata.name, **self.extra_env, **env}
        return {**base, "PYTHONPATH": python_path}

    def _value_from(self, pod: Any, source: Any) -> str:
        ns = pod.metadata.namespace
        if source.field_ref is not None:
            path = source.field_ref.field_path
            meta = pod.metadata
            simple = {
                "metadata.name": meta.name,
                "metadata.namespace": ns,
                "metadata.uid": meta.uid,
                "spec.nodeName": self.node_name,
                "spec.serviceAccountName": pod.spec.service_account_name,
                "status.podIP": self._ip_of(pod),
                "status.hostIP": "127.0.0.1",
            }
            if path in simple:
                return str(simple[path] or "")
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                return str((getattr(meta, match.group(1)) or {}).get(match.group(2), ""))
            raise ValueError(f"{pod.metadata.name}: unsupported fieldRef {path}")
        if source.config_map_key_ref is not None:
            ref = source.config_map_key_ref
            return str((self.core.read_namespaced_config_map(ref.name, ns).data or {})[ref.key])
        if source.secret_key_ref is not None:
            ref = source.secret_key_ref
            try:
                data = self.core.read_namespaced_secret(ref.name, ns).data or {}
            except client.ApiException as exc:
                if exc.status != 404 or not ref.optional:
                    raise
                data = {}
            if ref.key not in data and ref.optional:
                return ""
            return base64.b64decode(data[ref.key]).decode()
        if source.resource_field_ref is not None:
            return "1"
        raise ValueError(f"{pod.metadata.name}: unsupported valueFrom {source}")

    def _ip_of(self, pod: Any) -> str:
        state = self.pods.get(pod.metadata.uid)
        return state.ip if state is not None else "127.0.0.1"

    def _spawn(self, pod: Any, container: Any, mounts: dict[str, Path], state: _Pod) -> ProcessTree:
        env = self._env(pod, container, mounts)
        argv = [expand(a, env) for a in [*(container.command or []), *(container.args or [])]]
        if not argv:
            raise ValueError(f"{pod.metadata.name}/{container.name}: no command; a process node cannot run an image")
        argv = [self._rewrite(a, mounts) for a in argv]
        cwd = Path(self._rewrite(container.working_dir, mounts)) if container.working_dir else state.workdir
        cwd.mkdir(parents=True, exist_ok=True)
        with (state.workdir / f"{container.name}.log").open("ab") as log:
            state.log_offsets[container.name] = log.tell()
            tree = ProcessTree.start(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        state.procs[container.name] = tree
        return tree

    def _reap(self, state: _Pod) -> None:
        if any(tree.running() for tree in state.procs.values()):
            return
        state.phase = "Succeeded" if all(t.proc.returncode == 0 for t in state.procs.values()) else "Failed"
        self._report(state)

    def _stopped(self, state: _Pod) -> None:
        """Report how a deleted pod's containers ended, as the kubelet does before its last delete."""
        codes = [tree.proc.returncode for tree in state.procs.values()]
        state.phase = "Succeeded" if codes and all(code == 0 for code in codes) else "Failed"
        with contextlib.suppress(client.ApiException):
            self._report(state)

    def _kill(self, state: _Pod, grace: float) -> None:
        """As a kubelet stops a pod: SIGTERM, SIGKILL after the grace period; torchrun's workers
        (in sessions of their own) go too."""
        stop(list(state.procs.values()), grace)
        state.phase = "Stopped"

    # --- logs ----------------------------------------------------------------------------
    def _read_log(self, namespace: str, name: str, container: str, tail: int | None, follow: bool) -> Iterator[bytes]:
        """The log of the newest pod so named, as the kubelet serves it: its container's output
        since it started; with `follow`, more as it comes until the container exited."""
        state = self._named.get((namespace, name))
        if state is None or container not in state.log_offsets:
            return
        path = state.workdir / f"{container}.log"
        removed = not path.exists()  # as a kubelet removes a deleted pod's containers
        if removed or (self.no_log_once_deleted and self._being_deleted(namespace, name, state.uid)):
            tree = state.procs.get(container)
            raise ContainerRemoved(f"process://{tree.proc.pid if tree is not None else 0}")
        with path.open("rb") as log:
            log.seek(state.log_offsets[container])
            data = log.read()
            if tail is not None:
                data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail else b""
            yield data
            while follow:
                tree = state.procs.get(container)
                ended = tree is None or not tree.running() or state.phase == "Stopped"
                more = log.read()
                if more:
                    yield more
                elif ended:
                    return
                else:
                    time.sleep(POLL_S)

    def _being_deleted(self, namespace: str, name: str, uid: str) -> bool:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except client.ApiException as error:
            if error.status == 404:
                return True
            raise
        return bool(pod.metadata.uid != uid or pod.metadata.deletion_timestamp)

    # --- status --------------------------------------------------------------------------
    def _container_status(self, state: _Pod, name: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        code = proc.returncode
        base = {"name": name, "image": "", "imageID": "process://", "containerID": f"process://{proc.pid}"}
        if code is None:
            running = {"running": {"startedAt": state.started}}
            return {**base, "ready": True, "started": True, "restartCount": 0, "state": running}
        exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128+N, as runtimes report
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": state.started,
            "finishedAt": now(),
            "containerID": f"process://{proc.pid}",
        }
        if exit_code != 0 and state.fallback_to_logs.get(name):
            tail = self.logs(state.namespace, state.name, name).splitlines()[-TERMINATION_LOG_LINES:]
            terminated["message"] = "\n".join(tail)[-2048:]
        return {**base, "ready": False, "started": False, "restartCount": 0, "state": {"terminated": terminated}}

    def _report(self, state: _Pod, init_failed: tuple[str, int] | None = None) -> None:
        pod = self.core.read_namespaced_pod(state.name, state.namespace)
        images = {c.name: c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]}
        statuses = []
        for c in pod.spec.containers:
            tree = state.procs.get(c.name)
            if tree is None:
                waiting = {"waiting": {"reason": "PodInitializing"}}
                statuses.append(
                    {"name": c.name, "image": images[c.name], "ready": False, "restartCount": 0, "state": waiting}
                )
            else:
                statuses.append({**self._container_status(state, c.name, tree.proc), "image": images[c.name]})
        running = state.phase == "Running"
        ready = running and (state.ready or state.probe is None)
        flag = "True" if ready else "False"
        stamp = now()
        # Readiness moves when the probe's answer changes (lastTransitionTime with it).
        ready_at = state.ready_at if state.probe is not None and running else stamp
        conditions = [
            {"type": kind, "status": value, "lastTransitionTime": at}
            for kind, value, at in (
                ("PodScheduled", "True", stamp),
                ("Initialized", "False" if init_failed else "True", stamp),
                ("ContainersReady", flag, ready_at),
                ("Ready", flag, ready_at),
            )
        ]
        status: dict[str, Any] = {
            "phase": state.phase,
            "hostIP": "127.0.0.1",
            "podIP": state.ip,
            "podIPs": [{"ip": state.ip}],
            "startTime": state.started,
            "conditions": conditions,
            "containerStatuses": statuses,
        }
        if init_failed:
            status["message"] = f"init container {init_failed[0]} exited with {init_failed[1]}"
        self.core.patch_namespaced_pod_status(state.name, state.namespace, {"status": status})
