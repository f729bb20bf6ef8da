"""The contract between `Client.train` (kubetrain.client) and the runner it starts on every rank.

`train(fn, ...)` ships `fn` as two files in one directory: SOURCE_FILE, a module holding the
function's `def` and what it needs (kubetrain.client.ship writes it), and CALL_FILE, which
function of it to call with which JSON arguments (`FunctionCall`). Every rank runs
`torchrun -m kubetrain.runtime.guest.function DIR` (RUNNER_MODULE). On a cluster DIR is a ConfigMap
mounted at FUNCTION_DIR through spec.template; locally it is a folder of the run directory,
mapped to FUNCTION_DIR as `kubetrain run --local --volume` maps any volume. So both backends run
the very same TrainingJob.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field, JsonValue

# The runner's side of the files (standard library only), re-exported for the writers here.
from kubetrain.api.function_call import CALL_FILE as CALL_FILE
from kubetrain.api.function_call import FUNCTION_NAME_MAX, FUNCTION_NAME_PATTERN
from kubetrain.api.function_call import RUNNER_MODULE as RUNNER_MODULE
from kubetrain.api.function_call import SOURCE_FILE as SOURCE_FILE
from kubetrain.api.training import StrictModel

FUNCTION_DIR = "/kubetrain/function"
FUNCTION_VOLUME = "kubetrain-function"
# A ConfigMap holds at most 1 MiB (keys and values together); leave room for its metadata.
MAX_PAYLOAD_BYTES = 1_000_000


class FunctionCall(StrictModel):
    """Which function of SOURCE_FILE every rank calls, and with what."""

    function: Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN, max_length=FUNCTION_NAME_MAX)]
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


def runner_command(directory: str = FUNCTION_DIR) -> list[str]:
    """The container command of a shipped function: torchrun (configured by the PET_* variables
    the operator renders, as for the built-in trainer) running the runner on `directory`."""
    return ["torchrun", "-m", RUNNER_MODULE, directory]


def runs_function(command: Sequence[str] | None) -> bool:
    """Whether a container command runs the runner of shipped functions (`runner_command`)."""
    return command is not None and RUNNER_MODULE in command


def config_map_name(job_name: str) -> str:
    """The ConfigMap holding a function job's files (owned by the job: deleted with it)."""
    return f"{job_name}-function"
