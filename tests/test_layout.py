"""The package's layout stays as docs/architecture.md draws it: layers that point one way (read from
that document's diagram, so the two cannot drift apart), no import circle, modules small unless listed
with the reason they stay whole, and typed control-channel messages (transport/messages.py) rather than
tuples read by position, whose every field is a typed payload (no dict records, positional tuples or Any)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
import types
import typing
from pathlib import Path

import pytest

from ppkit.transport import messages

PACKAGE = Path(__file__).resolve().parents[1] / "ppkit"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MAX_LINES = 300  # a guide (shared/STYLE.md): a module may pass it, listed below with why it stays whole
LONGER = {
    "ppkit.cluster.controller": "the Cluster: its state machine and every public method of one class; its job "
                                "runner and post-mortems are already parts of their own (job_running.py, debug/)",
    "ppkit.exercises.course": "plain data, one entry per exercise of the course, read in one place by catalog.py "
                              "and by ppkit room without importing torch",
    "ppkit.transport.worker": "one rank's process: its job loop (main thread) and its reader thread share the job in "
                              "hand, the cancel and the output pipes; what has a concern of its own is already a "
                              "module (capture, metrics, flight_record, shown_traceback, interpreter_exit, debug/)",
}
LONGEST = 500  # even a listed module: past this, it holds more than one concern


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


# -- the layers, as docs/architecture.md draws them ----------------------------------------------------------------
_MEMBERS = re.compile(r"^ (ppkit/[\w./]*(?:, ppkit/[\w./]*)*)")


def drawn_layers(text: str) -> list[list[str]]:
    """The layers of the diagram under "## The layers", top first: each a list of its paths as drawn
    (``ppkit/cluster/`` a package, ``ppkit/preflight.py`` a module). Blocks between arrows (a line that is
    only "▼") are layers; a line that begins with ``ppkit/`` names members, several when separated by commas."""
    section = text.split("## The layers", 1)[1]
    diagram = section.split("```", 2)[1]
    layers: list[list[str]] = [[]]
    for line in diagram.splitlines():
        if line.strip() == "▼":
            layers.append([])
        elif match := _MEMBERS.match(line):
            layers[-1] += match.group(1).split(", ")
    return [layer for layer in layers if layer]


def _dotted(path: str) -> str:
    name = path.removesuffix("/").removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def layer_of(name: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """``(index, path)`` of the layer the most specific drawn path puts module ``name`` in (0: the top)."""
    best = None
    for index, layer in enumerate(layers):
        for path in layer:
            drawn = _dotted(path)
            is_package = path.endswith("/")
            if name == drawn or (is_package and name.startswith(drawn + ".")):
                if best is None or len(drawn) > len(_dotted(best[1])):
                    best = (index, path)
    return best


def upward_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Each import of ``graph`` from a module to one in a layer above its own, in words."""
    found = []
    for name in sorted(graph):
        here = layer_of(name, layers)
        for target in sorted(graph[name]):
            there = layer_of(target, layers)
            if here is not None and there is not None and there[0] < here[0]:
                found.append(f"{name} (layer {here[0]}, {here[1]}) imports {target} (layer {there[0]}, {there[1]}, "
                             "above it)")
    return found


LAYERS = drawn_layers(ARCHITECTURE.read_text())


def test_the_layers_are_read_from_the_architecture_doc():
    # a guard for the test below: if the diagram were not read, it would pass for nothing
    assert len(LAYERS) >= 6, LAYERS
    order = [layer_of(n, LAYERS)[0] for n in ("ppkit.cli.room", "ppkit.lessons.collectives", "ppkit",
                                             "ppkit.cluster.controller", "ppkit.transport.channel", "ppkit.errors")]
    assert order == sorted(order) and len(set(order)) == len(order), order
    assert layer_of("ppkit.progress.table", LAYERS)[1] == "ppkit/progress/table.py"  # the most specific path
    assert layer_of("ppkit.progress.hooks", LAYERS)[1] == "ppkit/progress/"


def test_every_module_belongs_to_a_drawn_layer():
    unplaced = sorted(name for name in MODULES if layer_of(name, LAYERS) is None)
    assert unplaced == [], f"draw these in docs/architecture.md's layers: {unplaced}"


def drawing_faults(layers: list[list[str]], modules) -> list[str]:
    """What a diagram draws wrong, in words: a path that names no module (one moved or removed since), and a
    path drawn more than once (the most specific path would then decide by which came first)."""
    faults = [f"{path} names no module" for layer in layers for path in layer
              if not any(name == _dotted(path) or (path.endswith("/") and name.startswith(_dotted(path) + "."))
                         for name in modules)]
    drawn = [path for layer in layers for path in layer]
    return faults + [f"{path} is drawn {drawn.count(path)} times" for path in sorted(set(drawn))
                     if drawn.count(path) > 1]


def test_every_drawn_path_names_a_module_once():
    assert drawing_faults(LAYERS, MODULES) == []


def test_a_stale_or_twice_drawn_path_is_caught():
    layers = [["ppkit/cli/", "ppkit/gone.py"], ["ppkit/cluster/", "ppkit/old_room/"], ["ppkit/cli/"]]
    assert drawing_faults(layers, MODULES) == ["ppkit/gone.py names no module", "ppkit/old_room/ names no module",
                                               "ppkit/cli/ is drawn 2 times"]


def test_imports_point_down_the_drawn_layers():
    assert upward_imports(GRAPH, LAYERS) == []


def test_an_import_from_a_layer_above_is_caught():
    graph = {"ppkit.transport.channel": {"ppkit.cluster.controller", "ppkit.errors"},
             "ppkit.cluster.controller": {"ppkit.transport.channel"}}
    assert upward_imports(graph, LAYERS) == [
        f"ppkit.transport.channel (layer {layer_of('ppkit.transport.channel', LAYERS)[0]}, ppkit/transport/) imports "
        f"ppkit.cluster.controller (layer {layer_of('ppkit.cluster', LAYERS)[0]}, ppkit/cluster/, above it)"]


def test_the_diagram_that_drew_profiling_and_progress_above_cluster_is_refused():
    # issue 46: the diagram drew profiling/ and progress/ above cluster/, which imports both
    layers = [layer for layer in LAYERS if "ppkit/profiling/" not in layer]
    moved = next(layer for layer in LAYERS if "ppkit/profiling/" in layer)
    layers.insert(1, moved)
    found = upward_imports(GRAPH, layers)
    assert any(line.startswith("ppkit.cluster.job_running ") and "ppkit.profiling." in line for line in found), found
    assert any(line.startswith("ppkit.cluster.hang_watch ") and "ppkit.progress" in line for line in found), found


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
    if name in LONGER:
        assert lines <= LONGEST, f"{name} has {lines} lines, over even a listed module's {LONGEST}: split it by concern"
    else:
        assert lines <= MAX_LINES, (f"{name} has {lines} lines. Split it by concern if a part of it has one of its own "
                                    f"(at most {MAX_LINES}); if what it holds belongs together, list it in LONGER "
                                    "with why (shared/STYLE.md: the number is a guide)")


@pytest.mark.parametrize("name", sorted(LONGER))
def test_a_listed_long_module_still_needs_its_place_in_the_list(name):
    assert name in MODULES, f"{name} is listed in LONGER but no longer exists"
    lines = len(MODULES[name].read_text().splitlines())
    assert lines > MAX_LINES, f"{name} has {lines} lines now: take it off LONGER"


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


# -- a part of a class is an object of its own, not a mixin that reaches into the class's state ----------------
OWNED_STATE_PACKAGES = ("ppkit.cluster", "ppkit.transport")


def _class_node(cls) -> ast.ClassDef | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    except (OSError, TypeError, IndentationError):
        return None


def _names_set_by(cls) -> set[str]:
    """What ``cls`` defines itself: its methods and class attributes, and every ``self.X = ...``."""
    node = _class_node(cls)
    names = set(vars(cls))
    if node is None:
        return names
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
            sub, (ast.AnnAssign, ast.AugAssign)) else []
        names.update(e.attr for t in targets for e in ast.walk(t)
                     if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self")
    return names


def private_state_read_but_not_owned(cls) -> list[str]:
    """The ``self._x`` that methods of ``cls`` read but neither ``cls`` nor a class it inherits from sets or
    defines: state some other class owns, as in a mixin that another class must be mixed with."""
    node = _class_node(cls)
    if node is None:
        return []
    owned = set().union(*(_names_set_by(base) for base in cls.__mro__ if base is not object))
    read = {sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
            and sub.value.id == "self" and sub.attr.startswith("_") and not sub.attr.startswith("__")}
    return sorted(read - owned)


def test_the_owned_state_check_catches_a_mixin(tmp_path, monkeypatch):
    # a guard for the test below, with the shape the cluster's job running had (issue 46)
    (tmp_path / "mixed.py").write_text(textwrap.dedent('''
        class Runs:
            def run(self):
                with self._one_job:
                    return self._launcher.go(self._conns)

        class Owner(Runs):
            def __init__(self):
                self._one_job, self._launcher, self._conns = None, None, {}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    mixed = importlib.import_module("mixed")
    assert private_state_read_but_not_owned(mixed.Runs) == ["_conns", "_launcher", "_one_job"]
    assert private_state_read_but_not_owned(mixed.Owner) == []


def test_no_class_reads_private_state_that_another_class_owns():
    found = []
    for name in sorted(n for n in MODULES if n.startswith(OWNED_STATE_PACKAGES)):
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == name and (missing := private_state_read_but_not_owned(cls)):
                found.append(f"{name}.{cls.__qualname__} reads {missing}, which it does not set: give the part its own "
                             "object, handed what it needs (shared/STYLE.md)")
    assert found == []
