"""A shipped function's files as its runner reads them, with the standard library only: the runner
(kubetrain.runtime.guest.function) runs in any image with torch, one without kubetrain's dependencies
included (kubetrain.runtime.bundle ships it). kubetrain.api.function's FunctionCall, a
pydantic model, writes call.json; tests/trainer/test_function_runner.py keeps the two agreeing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

SOURCE_FILE = "function.py"
CALL_FILE = "call.json"
RUNNER_MODULE = "kubetrain.runtime.guest.function"
FUNCTION_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
FUNCTION_NAME_MAX = 256


@dataclass(frozen=True)
class Call:
    """Which function of SOURCE_FILE every rank calls, and with what (JSON values)."""

    function: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)


def read_call(text: str) -> Call:
    """call.json's call; ValueError naming the field when it is not one FunctionCall would write."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(data) - {"function", "args", "kwargs"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field")
    name = data.get("function")
    if not isinstance(name, str) or len(name) > FUNCTION_NAME_MAX or not re.match(FUNCTION_NAME_PATTERN, name):
        raise ValueError(f"function: {name!r} is not a Python name")
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list):
        raise ValueError("args: not a list")
    if not isinstance(kwargs, dict):
        raise ValueError("kwargs: not an object")
    return Call(name, args, kwargs)
