"""spec.template on one machine: what `kubetrain run --local` maps, and what it refuses.

A local node is a process, not a container: there is no image and no mount namespace. So a
volume becomes a local directory and its mount path is rewritten to that directory wherever
the container names it (args and the command after the program, env values, workingDir),
the way checkpoint.dir becomes <run-dir>/checkpoints. Nothing is ignored silently:

- hostPath: the path itself; emptyDir: <run-dir>/volumes/<name>, new for each run directory;
  any volume given with `--volume NAME=DIR`: DIR (this also overrides the two above).
- every other volume (a PVC, a ConfigMap, a Secret, ...) exists only on a cluster: without
  `--volume NAME=DIR` the run is refused, naming the volume and the flag.
- envFrom (ConfigMaps/Secrets) is refused, like `valueFrom` in spec.env.
- imagePullSecrets: the image is private and a local run has no image (the command runs in
  this environment): refused unless `--no-image` says that is what you want.
- initContainers (and native sidecars) run other images: refused unless
  `--no-init-containers`.
- annotations, labels and the scheduling/security fields have no local meaning: noted.

`local-volumes.json` in the run directory records every mapping and note.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kubetrain.api.contract import is_reserved
from kubetrain.api.models import TrainingJob
from kubetrain.api.podtemplate import PodTemplate

VOLUMES_SUBDIR = "volumes"
RECORD = "local-volumes.json"
VOLUME_FLAG = "--volume"
NO_IMAGE_FLAG = "--no-image"
NO_INIT_FLAG = "--no-init-containers"
_NOT_LOCAL = ("labels", "annotations", "affinity", "topologySpreadConstraints", "runtimeClassName", "securityContext")


class UnmappableError(ValueError):
    """A template part this machine cannot provide; raised before any process starts."""


class Localizable(Protocol):
    """The part of local.plan.NodeProcess this module rewrites (a frozen dataclass)."""

    @property
    def argv(self) -> list[str]: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def cwd(self) -> str | None: ...


N = TypeVar("N", bound=Localizable)


@dataclass(frozen=True)
class LocalChoices:
    """The command line's answers to what a cluster has and this machine does not."""

    volumes: tuple[str, ...] = ()  # NAME=DIR, as given to --volume
    no_image: bool = False
    no_init_containers: bool = False


NO_CHOICES = LocalChoices()


def parse_volume_flags(values: Sequence[str]) -> dict[str, Path]:
    """`["data=/mnt/d", ...]` -> {"data": Path("/mnt/d")}; the directories must exist."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, directory = value.partition("=")
        if not (sep and name and directory):
            raise UnmappableError(f"{VOLUME_FLAG} {value!r}: expected NAME=DIR")
        if not Path(directory).is_dir():
            raise UnmappableError(f"{VOLUME_FLAG} {name}={directory}: not a directory")
        out[name] = Path(directory).resolve()
    return out


@dataclass(frozen=True)
class Mount:
    """A mount path of the trainer container and the local path it stands for."""

    path: str
    local: Path
    volume: str


@dataclass(frozen=True)
class LocalVolumes:
    """How one job's template maps onto this machine (the same for every node and attempt).

    emptyDir directories live under the run directory, which is chosen later: they are kept
    relative to it (`local` relative paths are resolved against the run directory)."""

    volumes: dict[str, Path] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    working_dir: str | None = None
    notes: tuple[str, ...] = ()

    def resolved(self, run_dir: Path) -> LocalVolumes:
        volumes = {
            name: run_dir.resolve() / path if not path.is_absolute() else path for name, path in self.volumes.items()
        }
        mounts = tuple(replace(m, local=volumes[m.volume] / m.local) for m in self.mounts)
        return replace(self, volumes=volumes, mounts=mounts)

    def map_path(self, value: str) -> str:
        """`value` with a mount path at its start (or after `--flag=`) replaced by its local path."""
        for mount in sorted(self.mounts, key=lambda m: len(m.path), reverse=True):
            root = mount.path.rstrip("/")
            if value == root or value.startswith(root + "/"):
                return str(mount.local) + value[len(root) :]
        prefix, sep, rest = value.partition("=")
        return f"{prefix}={self.map_path(rest)}" if sep and rest else value

    def cwd(self) -> str | None:
        """The local working directory: workingDir mapped, or (a directory of the image) ours."""
        if self.working_dir is None:
            return None
        mapped = self.map_path(self.working_dir)
        return mapped if mapped != self.working_dir else None

    def localize(self, node: N, run_dir: Path) -> N:
        """The node with the mount paths in its argv and env made local, and its working directory."""
        here = self.resolved(run_dir)
        env = {name: value if is_reserved(name) else here.map_path(value) for name, value in node.env.items()}
        # The program itself (argv[0]) comes from the image or PATH, not from a volume: kept, so
        # that a mount at /work cannot capture an interpreter that lives under /work here.
        argv = node.argv[:1] + [here.map_path(arg) for arg in node.argv[1:]]
        return replace(node, argv=argv, env=env, cwd=here.cwd())  # type: ignore[type-var]

    def describe(self, run_dir: Path) -> list[str]:
        """One line per mapping and note, for the terminal."""
        here = self.resolved(run_dir)
        lines = [f"volume {m.volume} ({here.kinds[m.volume]}): {m.path} -> {m.local}" for m in here.mounts]
        if self.working_dir:
            lines.append(
                f"workingDir {self.working_dir} -> {here.cwd() or 'the directory kubetrain runs in (the image)'}"
            )
        return lines + list(self.notes)

    def prepare(self, run_dir: Path) -> None:
        """Create the emptyDir directories and write the record of every mapping."""
        here = self.resolved(run_dir)
        for name, path in here.volumes.items():
            if here.kinds[name] == "emptyDir":
                path.mkdir(parents=True, exist_ok=True)
        record = {
            "volumes": {name: {"kind": here.kinds[name], "local": str(path)} for name, path in here.volumes.items()},
            "mounts": [{"mountPath": m.path, "volume": m.volume, "local": str(m.local)} for m in here.mounts],
            "workingDir": {"rendered": self.working_dir, "local": here.cwd()} if self.working_dir else None,
            "notes": list(self.notes),
        }
        (run_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _kind(volume: Mapping[str, Any]) -> str:
    return next((key for key in volume if key != "name"), "emptyDir")


def _volume_dirs(
    template: PodTemplate, given: Mapping[str, Path], refusals: list[str]
) -> tuple[dict[str, Path], dict[str, str]]:
    """Each volume's local directory and kind; what cannot be mapped is added to `refusals`."""
    volumes = (template.spec.volumes if template.spec else None) or []
    names = {volume["name"] for volume in volumes}
    known = ", ".join(sorted(names)) or "none"
    refusals += [
        f"{VOLUME_FLAG} {name}: spec.template.spec.volumes has no volume {name!r} ({known})"
        for name in given
        if name not in names
    ]
    dirs: dict[str, Path] = {}
    kinds: dict[str, str] = {}
    for index, volume in enumerate(volumes):
        name, kind = volume["name"], _kind(volume)
        kinds[name] = kind if name not in given else f"{kind} ({VOLUME_FLAG})"
        if name in given:
            dirs[name] = given[name]
        elif kind == "hostPath":
            dirs[name] = Path(volume["hostPath"]["path"])
        elif kind == "emptyDir":
            dirs[name] = Path(VOLUMES_SUBDIR) / name
        else:
            refusals.append(
                f"spec.template.spec.volumes[{index}] ({name}): a {kind} volume exists only on a cluster; "
                f"map it to a local directory with {VOLUME_FLAG} {name}=DIR"
            )
    return dirs, kinds


def _refusals(template: PodTemplate, choices: LocalChoices) -> list[str]:
    spec = template.spec
    trainer = spec.trainer() if spec else None
    found = []
    if trainer and trainer.env_from:
        found.append(
            "spec.template.spec.containers[0].envFrom: ConfigMaps and Secrets exist only on a cluster; "
            "locally set the variables in spec.env"
        )
    if spec and spec.image_pull_secrets and not choices.no_image:
        found.append(
            "spec.template.spec.imagePullSecrets: the image is private, and a local run has no image (the command "
            f"runs in this environment); pass {NO_IMAGE_FLAG} to run it so"
        )
    if spec and spec.init_containers and not choices.no_init_containers:
        names = ", ".join(container["name"] for container in spec.init_containers)
        found.append(
            f"spec.template.spec.initContainers ({names}): a local run runs only the trainer's command; "
            f"pass {NO_INIT_FLAG} to run without them"
        )
    return found


def plan_volumes(job: TrainingJob, choices: LocalChoices) -> LocalVolumes:
    """Map the job's template onto this machine, or raise UnmappableError naming all it cannot."""
    template = job.spec.template or PodTemplate()
    refusals = _refusals(template, choices)
    dirs, kinds = _volume_dirs(template, parse_volume_flags(choices.volumes), refusals)
    if refusals:
        # Every problem at once: one edit of the command line, not one per attempt.
        raise UnmappableError("\n  ".join(refusals))
    trainer = template.spec.trainer() if template.spec else None
    mounts = tuple(
        Mount(path=m["mountPath"], local=Path(m.get("subPath", "")), volume=m["name"])
        for m in ((trainer.volume_mounts if trainer else None) or [])
    )
    notes = [f"spec.template.{part}: no local meaning, not applied" for part in _present(template)]
    if choices.no_image and template.spec and template.spec.image_pull_secrets:
        notes.append(f"spec.template.spec.imagePullSecrets: {NO_IMAGE_FLAG}: the command runs in this environment")
    if choices.no_init_containers and template.spec and template.spec.init_containers:
        notes.append(f"spec.template.spec.initContainers: {NO_INIT_FLAG}: not run")
    notes += [f"{m.path}: readOnly is not enforced locally" for m in mounts if _read_only(trainer, m.path)]
    return LocalVolumes(
        volumes=dirs,
        kinds=kinds,
        mounts=mounts,
        working_dir=trainer.working_dir if trainer else None,
        notes=tuple(notes),
    )


def _present(template: PodTemplate) -> list[str]:
    meta = template.metadata.wire() if template.metadata else {}
    spec = template.spec.wire() if template.spec else {}
    return [f"metadata.{key}" for key in meta] + [f"spec.{key}" for key in spec if key in _NOT_LOCAL]


def _read_only(trainer: Any, path: str) -> bool:
    return any(m["mountPath"] == path and m.get("readOnly") for m in (trainer.volume_mounts or []))
