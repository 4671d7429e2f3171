"""The package's layout stays as the README's "How it works" draws it: small modules, layers that
point one way (transport never imports cluster or the package root), no import circle, and typed
control-channel messages (transport/messages.py) rather than tuples read by position, whose every
field is a typed payload (no dict records, positional tuples or Any)."""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from ppkit.transport import messages

PACKAGE = Path(__file__).resolve().parents[1] / "ppkit"
MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The ppkit modules that module ``name`` imports, anywhere in it (functions included)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
            # `from ppkit.cluster import worker_setup` names the module ppkit.cluster.worker_setup
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_import_graph_is_read_from_the_code():
    # a guard for the tests below: if parsing found no edges they would pass for nothing
    assert "ppkit.transport.channel" in GRAPH["ppkit.transport.worker"]
    assert "ppkit.cluster.controller" in GRAPH["ppkit.cluster.session"]
    assert "ppkit.cluster.worker_setup" in GRAPH["ppkit.cluster.controller"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("ppkit.transport")))
def test_transport_imports_nothing_above_it(name):
    upward = sorted(t for t in GRAPH[name]
                    if t == "ppkit" or not t.startswith(("ppkit.transport", "ppkit.errors")))
    assert upward == [], f"{name} imports {upward}: transport is the lowest layer"


def test_no_import_circle():
    cycles = []
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_messages_are_not_read_by_position():
    indexing = re.compile(r"\b(msg|item|reply|first|message)\[\d")
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for sub in ("cluster", "transport") for p in sorted((PACKAGE / sub).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if indexing.search(line)]
    assert found == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_small(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concern (at most {MAX_LINES})"


# -- typed payloads -------------------------------------------------------------------------------
# What a field of a control-channel message may be (transport/messages.py's docstring says why):
# plain values, another frozen dataclass of that module, a tuple[X, ...] of those (a sequence of
# like items, never a record read by position), or dict[str, str] (keys that are data: an env).
PLAIN = (str, int, float, bool, bytes, type(None))


def payload_problems(cls, module) -> list[str]:
    """Why the fields of dataclass ``cls`` (of ``module``) are not typed payloads: [] if they are."""
    problems = [] if cls.__dataclass_params__.frozen else [f"{cls.__name__} is not frozen"]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        problems += [f"{cls.__name__}.{f.name}: {why}" for why in _type_problems(hints[f.name], module)]
    return problems


def _type_problems(hint, module) -> list[str]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in PLAIN:
        return []
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and vars(module).get(hint.__name__) is hint:
        return []
    if origin in (types.UnionType, typing.Union):
        return [p for arg in args for p in _type_problems(arg, module)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _type_problems(args[0], module)
    if origin is dict and args == (str, str):
        return []
    return [f"{hint!r} is not a typed payload (a frozen dataclass of {module.__name__}, plain values, "
            "tuple[X, ...] or dict[str, str])"]


def test_the_payload_check_refuses_dicts_tuples_and_any():
    # a guard for the test below: each of these must be caught
    @dataclasses.dataclass(frozen=True)
    class Loose:
        a: dict
        b: tuple
        c: tuple[str, int]
        d: typing.Any
        e: dict[str, int]
        f: list[str]

    @dataclasses.dataclass
    class Thawed:
        a: int

    problems = payload_problems(Loose, messages)
    assert [p.split(":")[0] for p in problems] == [f"Loose.{n}" for n in "abcdef"]
    assert payload_problems(Thawed, messages) == ["Thawed is not frozen"]
    assert payload_problems(messages.Spawn, messages) == []  # tuple[int, ...]: a sequence


def test_every_message_and_payload_is_a_typed_frozen_dataclass():
    classes = [c for c in vars(messages).values() if isinstance(c, type) and c.__module__ == messages.__name__]
    assert len(classes) > 20 and all(dataclasses.is_dataclass(c) for c in classes), \
        [c.__name__ for c in classes if not dataclasses.is_dataclass(c)]
    assert [p for c in classes for p in payload_problems(c, messages)] == []
