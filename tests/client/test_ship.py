"""Shipping a function by source (kubetrain.client.ship): what is shipped runs as the original
does, and what cannot be shipped is refused with the reason, before anything exists."""

from __future__ import annotations

import functools
import json
import os.path as osp
import types
from json import dumps
from typing import Any

import pytest

from kubetrain.client import ShipError
from kubetrain.client.ship import ship

pytestmark = pytest.mark.unit

SCALE = 3
NAMES = ("a", "b")
OFFSETS = {"a": 1.5, "b": (2, 3)}
NAN = float("nan")
AN_OBJECT = object()


def scaled(x: int) -> int:
    return x * SCALE


class Accumulator:
    def __init__(self) -> None:
        self.total = 0.0

    def add(self, value: float) -> None:
        self.total += value * SCALE


def is_even(n: int) -> bool:
    return n == 0 or is_odd(n - 1)


def is_odd(n: int) -> bool:
    return n != 0 and is_even(n - 1)


def everything(n: int, *, label: str = "x") -> dict[str, Any]:
    """Reads a constant, a helper, a class, mutual recursion, two imported modules and an
    imported function; its annotations name things that are never shipped."""
    acc = Accumulator()
    for name in NAMES:
        acc.add(OFFSETS["a"] if name == "a" else len(name))
    return {
        "scaled": scaled(n),
        "total": acc.total,
        "even": is_even(n),
        "path": osp.join("a", label),
        "json": dumps({"n": n}),
        "again": json.loads(dumps([n])),
    }


def load(source: str) -> types.ModuleType:
    """The shipped source as a module of its own, as the runner loads it."""
    module = types.ModuleType("shipped")
    exec(compile(source, "<shipped>", "exec"), module.__dict__)
    return module


def test_the_shipped_module_computes_what_the_original_does() -> None:
    shipment = ship(everything, (4,), {"label": "y"})
    module = load(shipment.source)
    assert module.everything(4, label="y") == everything(4, label="y")
    assert (shipment.call.function, shipment.call.args, shipment.call.kwargs) == ("everything", [4], {"label": "y"})
    # Only what it reads, each once: the modules imported, the constants written, the rest by source.
    lines = shipment.source.splitlines()
    assert "import json" in lines and "import posixpath as osp" in lines and "from json import dumps" in lines
    assert "SCALE = 3" in lines and "NAMES = ('a', 'b')" in lines and "OFFSETS = {'a': 1.5, 'b': (2, 3)}" in lines
    for name in ("def scaled", "class Accumulator", "def is_even", "def is_odd", "def everything"):
        assert sum(line.startswith(name) for line in lines) == 1, name
    assert "NAN" not in shipment.source and "AN_OBJECT" not in shipment.source and "pytest" not in shipment.source
    assert "typing" not in shipment.source  # annotations are never evaluated: Any needs no import


def test_arguments_travel_as_json() -> None:
    shipment = ship(scaled, ((1, 2),))
    assert shipment.call.args == [[1, 2]]  # a tuple arrives as a list
    assert json.loads(shipment.call_json)["args"] == [[1, 2]]


def nested_maker() -> Any:
    factor = 2

    def inner(x: int) -> int:
        return x * factor

    return inner


def uses_an_object() -> None:
    print(AN_OBJECT)


def uses_nan() -> float:
    return NAN


def generator() -> Any:
    yield 1


async def coroutine() -> None:
    pass


square = lambda x: x * x  # noqa: E731


def uses_the_lambda(x: int) -> int:
    return int(square(x))


def wrapped(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    return wrapper


@wrapped
def decorated(x: int) -> int:
    return x


no_source_namespace: dict[str, Any] = {}
exec("def typed_at_a_prompt():\n    return 1\n", no_source_namespace)


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "says"),
    [
        (lambda x: x, (), {}, r"the function <lambda> is a lambda: define it with `def`"),
        (square, (), {}, r"is a lambda"),
        (nested_maker(), (1,), {}, r"nested_maker.<locals>.inner is nested inside nested_maker\(\): it may read"),
        (decorated, (1,), {}, r"decorated is a closure over fn \(a decorator's wrapper\?\)"),
        (Accumulator().add, (1.0,), {}, r"Accumulator.add is a bound method"),
        (functools.partial(scaled, 2), (), {}, r"is a functools.partial, not a function defined with `def`"),
        (len, ([],), {}, r"the function len is built in"),
        (generator, (), {}, r"generator is a generator or async function: calling it runs nothing"),
        (coroutine, (), {}, r"is a generator or async function"),
        (no_source_namespace["typed_at_a_prompt"], (), {}, r"typed_at_a_prompt: Python cannot find its source"),
        (uses_an_object, (), {}, r"uses_an_object reads the global 'AN_OBJECT', a builtins.object object: only"),
        (uses_nan, (), {}, r"uses_nan reads the global 'NAN', a builtins.float object"),
        (uses_the_lambda, (1,), {}, r"uses_the_lambda reads the global 'square', which is a lambda"),
        (scaled, (), {}, r"scaled\(\) cannot be called with these args/kwargs: missing a required argument: 'x'"),
        (scaled, ({1, 2},), {}, r"args\[0\]: a builtins.set is not JSON data"),
        (everything, (1,), {"label": {"k": float("inf")}}, r"kwargs\['label'\]\['k'\]: inf has no JSON form"),
        (scaled, ({1: "a"},), {}, r"args\[0\]: key 1 is not a str"),
    ],
)
def test_what_cannot_be_shipped_is_refused_naming_why(fn: Any, args: Any, kwargs: Any, says: str) -> None:
    with pytest.raises(ShipError, match=says):
        ship(fn, args, kwargs)


def test_a_payload_over_a_configmaps_size_is_refused() -> None:
    with pytest.raises(ShipError, match=r"take \d+ bytes, more than 1000000 \(a ConfigMap's limit\)"):
        ship(scaled, ("x" * 1_000_001,))
