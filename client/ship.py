"""Shipping a function by source: what `Client.train` sends to every rank, and what it refuses.

A function is shipped as a small module (`Shipment.source`): its own `def` as written, after
what the `def` and its body read from the module's globals, as the compiler's symbol table
of that source says (`symtable`, so a local variable is never mistaken for a global):

- a module                                  -> `import torch.distributed as dist`
- a function or class of another module     -> `from pkg.mod import helper` (imported on every
  rank: that module must be installed where the job runs, as kubetrain and torch are in the
  trainer image)
- a function or class of the function's own module (your notebook, script or module)
                                            -> its source, shipped by these same rules
- a literal constant: None, bool, int, float, complex, str, bytes, and tuples, lists, dicts and
  non-empty sets of them (what reads back equal from its repr)  -> `LR = 0.003`
- a builtin                                 -> nothing

Everything else is refused before anything is created, with the reason: a lambda, a nested
function or a closure (it reads the local variables of the function around it), a method,
a `functools.partial`, a generator or coroutine function, a function whose source Python cannot
find (typed at a `python` prompt or run with `python -c`), a global that is an object (a model,
a tensor, a DataFrame: create it inside the function or pass what builds it as an argument),
and arguments that are not JSON (`args` and `kwargs` travel as JSON: tuples arrive as lists).

The shipped module starts with `from __future__ import annotations`, so annotations are never
evaluated on the ranks and need nothing shipped.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import symtable
import sys
import textwrap
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubetrain.api.function import MAX_PAYLOAD_BYTES, FunctionCall
from kubetrain.client.errors import ShipError

FUTURE = "from __future__ import annotations"
_LITERAL_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_LITERAL_CONTAINERS = (tuple, list, set, dict)


@dataclass(frozen=True)
class Shipment:
    """What every rank receives: the module's source and the call."""

    source: str
    call: FunctionCall

    @property
    def call_json(self) -> str:
        return self.call.model_dump_json(indent=2) + "\n"

    def size(self) -> int:
        return len(self.source.encode()) + len(self.call_json.encode())


@dataclass
class _Module:
    """The shipped module being assembled."""

    imports: dict[str, str] = field(default_factory=dict)  # global name -> import line
    constants: dict[str, str] = field(default_factory=dict)  # global name -> assignment line
    definitions: dict[str, str] = field(default_factory=dict)  # global name -> source (dependencies first)

    def render(self, origin: str) -> str:
        head = [f"# Shipped by kubetrain.client from {origin}.", FUTURE, *sorted(set(self.imports.values()))]
        blocks = ["\n".join(head), "\n".join(self.constants.values()), *self.definitions.values()]
        return "\n\n".join(block.strip("\n") for block in blocks if block) + "\n"


def ship(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Shipment:
    """The shipment of `fn(*args, **kwargs)`; raises ShipError naming what cannot be shipped."""
    kwargs = dict(kwargs or {})
    refusal = _refusal(fn)
    if refusal is not None:
        raise ShipError(f"the function {_name(fn)} {refusal}")
    assert isinstance(fn, types.FunctionType)  # _refusal refused everything else
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as error:
        raise ShipError(f"{fn.__name__}() cannot be called with these args/kwargs: {error}") from None
    call = FunctionCall(function=fn.__name__, args=_json_args(args, "args"), kwargs=_json_kwargs(kwargs))
    module = _Module()
    _add_definition(fn, fn.__module__, fn.__globals__, module, path=[])
    origin = f"module {fn.__module__}" + (f" ({fn.__code__.co_filename})" if fn.__module__ == "__main__" else "")
    shipment = Shipment(source=module.render(origin), call=call)
    if shipment.size() > MAX_PAYLOAD_BYTES:
        raise ShipError(
            f"{fn.__name__}: the shipped source and arguments take {shipment.size()} bytes, more than "
            f"{MAX_PAYLOAD_BYTES} (a ConfigMap's limit): pass data through a volume or a URL, not as arguments"
        )
    return shipment


# --- the function itself ------------------------------------------------------------------------


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)


def _refusal(fn: object) -> str | None:
    """Why `fn` cannot be shipped as a top-level `def` (None: it can)."""
    if isinstance(fn, types.MethodType):
        return "is a bound method: its object cannot be shipped; ship a plain function"
    if isinstance(fn, types.BuiltinFunctionType | types.BuiltinMethodType):
        return "is built in: it has no Python source to ship"
    if not isinstance(fn, types.FunctionType):
        partial = " (a functools.partial: ship the function and pass its arguments)" if hasattr(fn, "func") else ""
        return f"is a {type(fn).__module__}.{type(fn).__qualname__}, not a function defined with `def`{partial}"
    if fn.__name__ == "<lambda>":
        return "is a lambda: define it with `def` at the top level of a module or notebook cell"
    if "<locals>" in fn.__qualname__:
        outer = fn.__qualname__.split(".<locals>")[0]
        return (
            f"is nested inside {outer}(): it may read that function's local variables, which cannot be "
            "shipped; define it at the top level of its module or notebook cell"
        )
    if fn.__code__.co_freevars:
        return (
            f"is a closure over {', '.join(fn.__code__.co_freevars)} (a decorator's wrapper?): only a "
            "plain top-level function can be shipped"
        )
    if "." in fn.__qualname__:
        return "is defined in a class: ship a top-level function"
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return "is a generator or async function: calling it runs nothing"
    return None


def _source(obj: Any, name: str) -> str:
    """The dedented source of a top-level `def` or `class` called `name`."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError) as error:
        raise ShipError(
            f"{name}: Python cannot find its source ({error}); define it in a file, a module or a notebook "
            "cell, not at a `python` prompt or in `python -c`"
        ) from None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        raise ShipError(f"{name}: its source does not parse on its own (defined inside an expression?)") from None
    kinds = (ast.FunctionDef, ast.ClassDef)
    if len(tree.body) != 1 or not isinstance(tree.body[0], kinds) or tree.body[0].name != obj.__name__:
        raise ShipError(f"{name}: its source is not one `def`/`class` statement named {obj.__name__}")
    return source


def _globals_read(source: str) -> list[str]:
    """The global names `source` (one top-level statement) reads, in order of appearance."""
    table = symtable.symtable(f"{FUTURE}\n{source}", "<shipped>", "exec")
    bound_at_top = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    names: list[str] = []

    def visit(scope: symtable.SymbolTable) -> None:
        for symbol in scope.get_symbols():
            top = scope is table
            if symbol.is_referenced() and symbol.is_global() and not (top and symbol.get_name() in bound_at_top):
                names.append(symbol.get_name())
        for child in scope.get_children():
            visit(child)

    visit(table)
    return list(dict.fromkeys(names))


# --- what it reads ------------------------------------------------------------------------------


def _add_definition(obj: Any, home: str, namespace: Mapping[str, Any], module: _Module, path: list[str]) -> None:
    """Ship `obj` (a function or class of module `home`) by source, after what it reads."""
    name = obj.__name__
    if name in module.definitions or name in path:
        return  # already shipped, or on the way (mutual recursion resolves when called)
    where = " -> ".join([*path, name])
    source = _source(obj, where)
    for global_name in _globals_read(source):
        _add_global(global_name, namespace, home, module, [*path, name])
    module.definitions[name] = source


def _add_global(name: str, namespace: Mapping[str, Any], home: str, module: _Module, path: list[str]) -> None:
    if name in module.imports or name in module.constants or name in module.definitions:
        return
    if name not in namespace:
        # A builtin, or a name nothing defines yet (it fails on the ranks as it would here).
        return
    value = namespace[name]
    if value is getattr(builtins, name, object()):
        return
    where = f"{' -> '.join(path)} reads the global {name!r}"
    if isinstance(value, types.ModuleType):
        if value.__name__ == "__main__":
            raise ShipError(f"{where}: the __main__ module itself cannot be shipped")
        module.imports[name] = (
            f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
        )
        return
    if _is_literal(value):
        module.constants[name] = f"{name} = {value!r}"
        return
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        if getattr(value, "__module__", None) != home:
            module.imports[name] = _import_line(value, name, where)
            return
        refusal = _refusal(value) if not isinstance(value, type) else None
        if refusal is None and not _is_top_level(value, name):
            refusal = f"is {_name(value)} under another name: refer to it by its own name"
        if refusal is not None:
            raise ShipError(f"{where}, which {refusal}")
        _add_definition(value, home, namespace, module, path)
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise ShipError(
        f"{where}, a {kind} object: only modules, functions, classes and literal constants can be shipped; "
        "create it inside the function, or pass what builds it through args/kwargs"
    )


def _is_top_level(value: Any, name: str) -> bool:
    return getattr(value, "__qualname__", None) == name == getattr(value, "__name__", None)


def _import_line(value: Any, name: str, where: str) -> str:
    """`from <module> import <name>` for an object another module defines; that module must be
    importable under its name (it is then on every rank too, if installed there)."""
    owner, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not owner or owner == "__main__" or "." in qualname or "<" in qualname:
        raise ShipError(
            f"{where}, {qualname or value!r} from {owner or 'no module'}: it cannot be imported by name "
            "on the ranks; define it at the top level of a module"
        )
    found = getattr(sys.modules.get(owner), qualname, None)
    if found is not value:
        raise ShipError(f"{where}: {owner}.{qualname} does not name it, so the ranks could not import it")
    return f"from {owner} import {qualname}" + ("" if qualname == name else f" as {name}")


def _is_literal(value: Any, depth: int = 0) -> bool:
    """A value whose repr is a Python literal that reads back equal (so NaN and inf are not)."""
    if depth > 20:
        return False
    if isinstance(value, float | complex):
        parts = (value.real, value.imag) if isinstance(value, complex) else (value,)
        return all(math.isfinite(part) for part in parts)
    if type(value) in _LITERAL_ATOMS:
        return True
    if type(value) in _LITERAL_CONTAINERS:
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)
        if not all(_is_literal(item, depth + 1) for item in items):
            return False
        try:
            return bool(ast.literal_eval(repr(value)) == value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
    return False


# --- the arguments ------------------------------------------------------------------------------


def _json_args(args: Sequence[Any], where: str) -> list[Any]:
    return [_json(value, f"{where}[{index}]") for index, value in enumerate(args)]


def _json_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _json(value, f"kwargs[{key!r}]") for key, value in kwargs.items()}


def _json(value: Any, where: str) -> Any:
    """`value` as JSON data (tuples become lists); ShipError naming the first part that is not."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise ShipError(f"{where}: {value!r} has no JSON form")
        return value
    if type(value) in (list, tuple):
        return [_json(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ShipError(f"{where}: key {key!r} is not a str (JSON object keys are strings)")
            out[key] = _json(item, f"{where}[{key!r}]")
        return out
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise ShipError(
        f"{where}: a {kind} is not JSON data; arguments travel as JSON (None, bool, int, float, str, "
        "lists and dicts with str keys): pass a path or a URL for data, a name or a config for objects"
    )
