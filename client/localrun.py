"""The local backend: `kubetrain run --local`'s machinery in this process, one thread per job.

A job's run directory is `<run_dir>/<name>` (a name is unique there, as in a namespace) and
holds what `kubetrain run --local --run-dir` writes: job.yaml, pods.yaml, node-<i>.log,
status.json, summary.json, checkpoints/, metrics.png. Two more files: output.log (what the
command would have printed: the `[node-i]` lines, notices and the summary) and
configmaps/<name>/ (the ConfigMaps a job mounts, given by the client: a train() job's function;
each is mapped to its volume as `--volume NAME=DIR` maps one). The plan, the supervisor (the
operator's gang decision), the status and the pods' env are the command's own
(kubetrain.local); no `kubetrain` subprocess is started, only the nodes' torchrun processes.

A job runs as long as the Python process that submitted it: its supervisor is a thread of
this process, and at exit every job still running here is stopped as Ctrl-C stops the command.
Another process sees a run directory as it was left (its status.json), and cannot wait on it.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from kubetrain.api import naming
from kubetrain.api.manifest import InvalidTrainingJob, load, parse
from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.client.errors import AlreadyExists, InvalidJob, JobNotFound, JobStopped
from kubetrain.client.logs import NodePod
from kubetrain.client.spec import random_suffix
from kubetrain.local.localize import LocalRunError
from kubetrain.local.plan import ATTEMPTS_SUBDIR, check_commands, plan_job, write_run_files
from kubetrain.local.run import run_supervisor
from kubetrain.local.supervisor import ATTEMPT_BANNER, STATUS_FILE, Supervisor
from kubetrain.local.view import PlainView, make_view
from kubetrain.local.volumes import LocalChoices, UnmappableError

JOB_FILE = "job.yaml"
SUMMARY_FILE = "summary.json"
OUTPUT_FILE = "output.log"
CONFIG_MAPS_SUBDIR = "configmaps"
FOLLOW_POLL_S = 0.1


@dataclass
class _Run:
    """A job supervised by this process."""

    supervisor: Supervisor
    thread: threading.Thread | None = None
    exit_code: int | None = None
    error: str | None = None
    errors: io.StringIO = field(default_factory=io.StringIO)

    def stop(self) -> None:
        self.supervisor.stop_requested.set()
        if self.thread is not None:
            self.thread.join()


# Every job this process supervises, by its run directory: each Client("local") of the process
# sees them (a Job handle made by client.job(name) can wait on a job another client started).
_runs: dict[Path, _Run] = {}
_runs_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """At exit, no node process outlives the Python process that supervised it."""
    with _runs_lock:
        runs = list(_runs.values())
    for run in runs:
        run.stop()


class LocalBackend:
    kind: Literal["local"] = "local"
    poll_s = 0.2

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def namespace(self) -> str:
        return str(self.root)

    def _dir(self, name: str) -> Path:
        return (self.root / name).resolve()

    def _run(self, name: str) -> _Run | None:
        with _runs_lock:
            return _runs.get(self._dir(name))

    # --- create ---------------------------------------------------------------------------------

    def create(self, job: TrainingJob, config_maps: Mapping[str, Mapping[str, str]]) -> TrainingJob:
        job = _named(job)
        run_dir = self._dir(job.name)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise AlreadyExists(
                f"trainingjob {job.name} already exists in {self.root} (delete it first, or choose another name)"
            ) from None
        try:
            volumes = _write_config_maps(job, run_dir, config_maps)
            plan = plan_job(job, run_dir=run_dir, choices=LocalChoices(volumes=volumes))
            check_commands(plan)
        except (LocalRunError, UnmappableError) as error:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise InvalidJob(f"trainingjob {job.name} cannot run here: {error}") from None
        write_run_files(plan, plan.nodes(attempt=0, master_port=plan.job.spec.master_port))
        out = (run_dir / OUTPUT_FILE).open("w")
        view = make_view(out, live=False)
        run = _Run(Supervisor(plan, view))
        with _runs_lock:
            _runs[run_dir] = run
        run.thread = threading.Thread(
            target=_supervise, args=(run, view, out), name=f"kubetrain-{job.name}", daemon=True
        )
        run.thread.start()
        return self.get(job.name)

    # --- read -----------------------------------------------------------------------------------

    def get(self, name: str) -> TrainingJob:
        run_dir = self._dir(name)
        path = run_dir / JOB_FILE
        if not path.is_file():
            raise JobNotFound(f"trainingjob {name} not found in {self.root}")
        try:
            job = load(path)
        except InvalidTrainingJob as error:
            raise JobNotFound(f"trainingjob {name}: {path} is not a TrainingJob: {error}") from None
        return job.model_copy(update={"status": read_status(run_dir)})

    def status(self, name: str) -> TrainingJobStatus:
        run_dir = self._dir(name)
        if not (run_dir / JOB_FILE).is_file():
            raise JobNotFound(f"trainingjob {name} not found in {self.root}")
        return read_status(run_dir)

    def list(self) -> list[TrainingJob]:
        if not self.root.is_dir():
            return []
        names = sorted(p.name for p in self.root.iterdir() if (p / JOB_FILE).is_file())
        jobs = []
        for name in names:
            with contextlib.suppress(JobNotFound):
                job = self.get(name)
                if job.metadata.name == name:  # a `kubetrain run --local` run dir is named <job>-<time>
                    jobs.append(job)
        return jobs

    def log_source(self, name: str) -> LocalLogs:
        self.get(name)  # JobNotFound before anything else
        return LocalLogs(self.namespace, self._dir(name), self._run(name))

    # --- lifecycle ------------------------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Stop the job's processes (as Ctrl-C does) and remove its run directory: like a deleted
        TrainingJob, its status and logs are gone."""
        run_dir = self._dir(name)
        if not (run_dir / JOB_FILE).is_file():
            raise JobNotFound(f"trainingjob {name} not found in {self.root}")
        run = self._run(name)
        if run is not None:
            run.stop()
            with _runs_lock:
                _runs.pop(run_dir, None)
        shutil.rmtree(run_dir)

    def settle(self, name: str) -> None:
        run = self._run(name)
        if run is not None and run.thread is not None:
            run.thread.join()

    def ensure_live(self, name: str) -> None:
        run = self._run(name)
        if run is None:
            raise JobStopped(
                f"trainingjob {name} is not running in this Python process: a local job runs only as long as "
                f"the process that submitted it (its run directory {self._dir(name)} holds its last status)"
            )
        if run.thread is not None and not run.thread.is_alive():
            if run.error is not None:
                raise JobStopped(f"trainingjob {name}: its local supervisor failed: {run.error}")
            said = run.errors.getvalue().strip()
            reason = said or "it was stopped"
            raise JobStopped(f"trainingjob {name} ended without succeeding or failing: {reason}")


def _supervise(run: _Run, view: PlainView, out: TextIO) -> None:
    """The job's thread: the supervisor to its end, printing what the command prints to output.log."""
    try:
        with out:
            run.exit_code = run_supervisor(run.supervisor, view, run.errors)
    except Exception as error:  # the thread's only reporter: Job.wait raises it as JobStopped
        run.error = f"{type(error).__name__}: {error}"


def _named(job: TrainingJob) -> TrainingJob:
    """The job with metadata.name set (from generateName, as the API server sets it)."""
    if job.metadata.name is not None:
        return job
    document = job.wire()
    document["metadata"]["name"] = f"{document['metadata'].pop('generateName')}{random_suffix()}"
    try:
        return parse(document, "the TrainingJob")
    except InvalidTrainingJob as error:
        raise InvalidJob(str(error)) from None


def _write_config_maps(
    job: TrainingJob, run_dir: Path, config_maps: Mapping[str, Mapping[str, str]]
) -> tuple[str, ...]:
    """Write each given ConfigMap's files; `--volume` values mapping the volumes that mount them."""
    volumes = (job.spec.template.wire().get("spec", {}).get("volumes", []) if job.spec.template else []) or []
    mapped = []
    for volume in volumes:
        name = str((volume.get("configMap") or {}).get("name"))
        if name not in config_maps:
            continue
        directory = run_dir / CONFIG_MAPS_SUBDIR / name
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in config_maps[name].items():
            (directory / key).write_text(text)
        mapped.append(f"{volume['name']}={directory}")
    return tuple(mapped)


def read_status(run_dir: Path) -> TrainingJobStatus:
    """status.json (the shape of the cluster's `.status`); empty before the supervisor's first write."""
    path = run_dir / STATUS_FILE
    if not path.is_file():
        return TrainingJobStatus()
    return TrainingJobStatus.model_validate(json.loads(path.read_text()))


# --- logs -----------------------------------------------------------------------------------------


class _AttemptReader:
    """Reads one attempt's lines of a node-<i>.log as the file grows (between the supervisor's
    marker of that attempt and the next one's)."""

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.offset = 0
        self.current: int | None = None
        self.past = False  # a later attempt started: nothing more of this one will come

    def read(self, path: Path) -> list[str]:
        """The attempt's complete lines written since the last read."""
        if not path.is_file():
            return []
        with path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        lines = []
        for line in data[:end].decode(errors="replace").splitlines():
            found = _marker(line)
            if found is not None:
                self.current = found
                self.past = self.past or found > self.attempt
            elif self.current == self.attempt:
                lines.append(line)
        return lines


def _marker(line: str) -> int | None:
    """N, on the line the supervisor writes into node-<i>.log when it starts attempt N."""
    if line.startswith(ATTEMPT_BANNER) and line.endswith(" ==="):
        number = line[len(ATTEMPT_BANNER) : -len(" ===")]
        return int(number) if number.isdigit() else None
    return None


class LocalLogs:
    """A local job as `kubetrain logs` reads a cluster's (kubetrain.client.logs.LogSource): each node
    process of each attempt is a pod (`<job>-node-<rank>`), phased as the supervisor saw it, and its
    log is its attempt's part of node-<rank>.log."""

    def __init__(self, namespace: str, run_dir: Path, run: _Run | None) -> None:
        self.namespace = namespace
        self.run_dir = run_dir
        self.run = run
        self.name = load(run_dir / JOB_FILE).name

    def job(self, name: str) -> dict[str, Any]:
        document = load(self.run_dir / JOB_FILE).wire()
        document["metadata"]["uid"] = "local"
        document["status"] = read_status(self.run_dir).wire()
        return document

    def _phases(self) -> dict[tuple[int, int], str]:
        if self.run is not None:
            return self.run.supervisor.node_phases()
        return self._phases_from_files()

    def _phases_from_files(self) -> dict[tuple[int, int], str]:
        """A run not supervised here, as its files tell it: every attempt but the last failed (the
        gang restarted); the last attempt's exit codes are in summary.json once the run ended."""
        found = set()
        for path in self.run_dir.glob("node-*.log"):
            rank = int(path.stem.removeprefix("node-"))
            reader = _AttemptReader(-1)
            reader.read(path)
            found |= {(attempt, rank) for attempt in range(reader.current + 1)} if reader.current is not None else set()
        summary = self.run_dir / SUMMARY_FILE
        codes = json.loads(summary.read_text()).get("nodeExitCodes", []) if summary.is_file() else []
        last = max((attempt for attempt, _ in found), default=0)
        phases = {}
        for attempt, rank in found:
            code = codes[rank] if attempt == last and rank < len(codes) else None
            if attempt < last:
                phases[(attempt, rank)] = "Failed"
            else:
                phases[(attempt, rank)] = "Unknown" if code is None else "Succeeded" if code == 0 else "Failed"
        return phases

    def _node(self, attempt: int, rank: int, phase: str) -> NodePod:
        return NodePod(name=naming.pod_name(self.name, rank), rank=rank, attempt=attempt, phase=phase, started=True)

    def pods(self, label_selector: str) -> list[NodePod]:
        return [self._node(attempt, rank, phase) for (attempt, rank), phase in sorted(self._phases().items())]

    def pod(self, pod: NodePod) -> NodePod | None:
        phase = self._phases().get((pod.attempt, pod.rank))
        return None if phase is None else self._node(pod.attempt, pod.rank, phase)

    def archive(self, name: str, uid: str, attempt: int) -> dict[int, str] | None:
        """The attempt's node logs as the run directory keeps them (attempts/<N>/node-<i>.log)."""
        folder = self.run_dir / ATTEMPTS_SUBDIR / str(attempt)
        if not folder.is_dir():
            return None
        found = ((naming.log_archive_rank(path.name), path) for path in folder.iterdir())
        return {rank: path.read_text(errors="replace") for rank, path in found if rank is not None}

    def archived_attempts(self, name: str, uid: str) -> list[int]:
        return sorted(int(path.name) for path in (self.run_dir / ATTEMPTS_SUBDIR).glob("*") if path.name.isdigit())

    def _path(self, pod: NodePod) -> Path:
        return self.run_dir / f"node-{pod.rank}.log"

    def log(self, pod: NodePod, tail: int | None) -> str:
        lines = _AttemptReader(pod.attempt).read(self._path(pod))
        if tail is not None:
            lines = lines[-tail:] if tail else []
        return "".join(f"{line}\n" for line in lines)

    def stream(self, pod: NodePod, tail: int | None) -> Iterator[str]:
        """The attempt's lines as the node writes them, until its process ended (by then all its
        output is in the file: the supervisor drains a node before its phase says it ended)."""
        reader = _AttemptReader(pod.attempt)
        lines = reader.read(self._path(pod))
        yield from lines if tail is None else lines[-tail:] if tail else []
        while not reader.past:
            ended = (self.pod(pod) or pod).phase != "Running"
            yield from reader.read(self._path(pod))
            if ended:
                return
            time.sleep(FOLLOW_POLL_S)
