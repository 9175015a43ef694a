"""The layout shows the architecture, and this test keeps it so: it reads every module's imports (at module
level and inside functions) and names the rule a new import breaks.

    domain/       pure: the standard library and the domain only
    services/     the use cases: the domain, the ports and other services; no adapter, no git, github or sqlalchemy
    adapters/     technology behind the ports: never a service, the API or the CLI
    composition   the one place that names both services and adapters, and wires them
and no import cycle between any two modules of the gateway, nor between two rooms: the folders of services/
(change at the bottom; admin, agents, day_two, forge and notifications above it) and of adapters/ depend one
way. What the change room needs done by a room above it, it asks through `Workspace.reactions`, which the
composition root wires.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gateway"

# Service modules still reaching an adapter, each with why, until a port replaces it. The list only shrinks:
# a new entry is a design decision to argue in review, not a way to make this test pass.
KNOWN_SERVICE_IMPORTS: dict[tuple[str, str], str] = {
}
THIRD_PARTY_IN_SERVICES = ("git", "github", "sqlalchemy")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module `name` imports, at module level or inside a function (the full dotted names)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:` (imports for annotations only never run)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _internal(imported: str) -> str | None:
    while imported and imported not in MODULES:
        imported = imported.rpartition(".")[0]
    return imported or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in (_internal(i) for i in _imports(name, path)) if m and m != name}
    return graph


def _broken(rule: str, module: str, imported: str) -> str:
    return f"{module} imports {imported}: {rule}"


def test_the_domain_is_pure() -> None:
    stdlib = sys.stdlib_module_names
    broken = [_broken("the domain imports only the standard library and the domain", name, imported)
              for name, path in MODULES.items() if name.startswith("gateway.domain")
              for imported in _imports(name, path)
              if imported.split(".")[0] not in stdlib and not imported.startswith("gateway.domain")
              and imported != "__future__"]
    assert broken == []


def test_services_reach_adapters_only_through_ports() -> None:
    broken, still_known = [], set()
    for name, path in MODULES.items():
        if not name.startswith("gateway.services"):
            continue
        for imported in set(_imports(name, path)):
            top = imported.split(".")[0]
            if top in THIRD_PARTY_IN_SERVICES:
                target = top
            elif imported.startswith("gateway.adapters"):
                target = _internal(imported) or imported
            else:
                continue
            known = next((k for k in KNOWN_SERVICE_IMPORTS
                          if k[0] == name and (target == k[1] or target.startswith(k[1] + "."))), None)
            if known:
                still_known.add(known)
            else:
                broken.append(_broken("a service names ports (gateway/ports/), never an adapter or git, "
                                      "github, sqlalchemy; wire the adapter in gateway/composition.py", name, target))
    assert sorted(set(broken)) == []
    assert set(KNOWN_SERVICE_IMPORTS) - still_known == set(), "fixed: take these off KNOWN_SERVICE_IMPORTS"


def test_adapters_never_import_services_the_api_or_the_cli() -> None:
    broken = [_broken("an adapter implements a port; it never calls a use case", name, imported)
              for name, path in MODULES.items() if name.startswith("gateway.adapters")
              for imported in _imports(name, path)
              if imported.startswith(("gateway.services", "gateway.api", "gateway.cli", "gateway.commands",
                                      "gateway.composition"))]
    assert broken == []


def test_no_import_cycle_between_modules() -> None:
    graph = _graph()
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == [], "import cycles (a late import inside a function counts too): " + "; ".join(
        " <-> ".join(sorted(c)) for c in cycles)


def test_ports_take_and_return_records_not_dicts() -> None:
    """A port's signature names records (dataclasses), values or read-only Mappings, never a `dict`: a dict at a port
    is a row whose keys every caller must know."""
    found = []
    ports = [node for path in sorted((PACKAGE / "ports").glob("*.py")) for node in ast.parse(path.read_text()).body]
    assert len(ports) > 40, "the scan sees the ports"
    for port in (node for node in ports if isinstance(node, ast.ClassDef)):
        for method in (node for node in port.body if isinstance(node, ast.FunctionDef)):
            arguments = method.args.args + method.args.kwonlyargs
            annotations = [a.annotation for a in arguments if a.annotation] + ([method.returns] if method.returns else [])
            if any(isinstance(n, ast.Name) and n.id == "dict" for a in annotations for n in ast.walk(a)):
                found.append(f"{port.name}.{method.name}")
    assert found == [], "ports with a dict in their signature: " + ", ".join(found)


@pytest.mark.parametrize("layer", ["gateway.services", "gateway.adapters"])
def test_rooms_depend_one_way(layer: str) -> None:
    """No cycle between the rooms (sub-packages, or modules directly in the layer) of services/ or adapters/."""
    edges: dict[tuple[str, str], set[str]] = {}
    for module, imported in _graph().items():
        for target in imported:
            here, there = _room(layer, module), _room(layer, target)
            if here and there and here != there:
                edges.setdefault((here, there), set()).add(f"{module} -> {target}")
    rooms: dict[str, set[str]] = {}
    for here, there in edges:
        rooms.setdefault(here, set()).add(there)
        rooms.setdefault(there, set())
    cycles = [c for c in _strongly_connected(rooms) if len(c) > 1]
    assert cycles == [], "rooms importing each other: " + "; ".join(
        ", ".join(sorted(why for (a, b), whys in edges.items() if {a, b} <= c for why in whys)) for c in cycles)


def _room(layer: str, module: str) -> str | None:
    return module[len(layer) + 1:].split(".")[0] if module.startswith(layer + ".") else None


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found


@pytest.mark.parametrize("rule", ["domain", "services", "adapters"])
def test_the_rules_see_real_imports(rule: str) -> None:
    """The scanner itself: it finds imports that exist (a rule that sees nothing would pass by accident)."""
    prefix = {"domain": "gateway.domain.", "services": "gateway.services.", "adapters": "gateway.adapters."}[rule]
    seen = {i for n, p in MODULES.items() if n.startswith(prefix) for i in _imports(n, p)}
    assert any(i.startswith(prefix) for i in seen)
    assert "gateway.ports" in {i for n, p in MODULES.items() if n.startswith("gateway.services") for i in _imports(n, p)}


# What each narrow dependency of services/workspace.py holds: a use case takes the narrowest that holds what it
# touches, and the whole `Workspace` only when none does (cosmicpython's handlers take their dependencies).
NARROW = ("Records", "Configured", "MainRules", "Signed", "Identified", "Delivering")
WHOLE = frozenset({"*"})
# Rooms not yet read with this rule, until they are. The list only shrinks.
NOT_YET_NARROWED = ("gateway.services.change.views.", "gateway.services.change.read_model.",
                    "gateway.services.change.plan_rounds.", "gateway.services.change.jobs.")


def test_use_cases_take_what_they_use() -> None:
    """A service function that takes the whole `Workspace` touches more of it than any narrow dependency holds (or
    hands it on whole): what it reads of it, and what the service functions it hands it to read, to the bottom."""
    from gateway.services import workspace

    holds = {name: _members(getattr(workspace, name)) for name in NARROW}
    functions = _service_functions()
    assert len(functions) > 250, "the scan sees the use cases"
    touched: dict[str, frozenset[str]] = {}
    too_wide = []
    for name, (_, _, annotation) in sorted(functions.items()):
        if annotation != "Workspace" or name.startswith(NOT_YET_NARROWED):
            continue
        uses = _touches(name, functions, touched)
        narrow = next((n for n in NARROW if uses <= holds[n]), None)
        if narrow is not None:
            too_wide.append(f"{name} touches only {', '.join(sorted(uses)) or 'nothing'} of its workspace: take {narrow}")
    assert too_wide == [], "use cases taking the whole workspace:\n" + "\n".join(too_wide)


def _members(protocol: type) -> frozenset[str]:
    return frozenset(n for klass in protocol.__mro__ if klass.__module__ == "gateway.services.workspace"
                     for n in vars(klass) if not n.startswith("_"))


def _service_functions() -> dict[str, tuple[ast.FunctionDef, str, str]]:
    """Every function of services/ with a workspace parameter, by `module.function`: the parameter and its type."""
    found: dict[str, tuple[ast.FunctionDef, str, str]] = {}
    for module, path in MODULES.items():
        if not module.startswith("gateway.services."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for argument in node.args.args + node.args.kwonlyargs:
                annotation = ast.unparse(argument.annotation) if argument.annotation else ""
                if annotation == "Workspace" or annotation in NARROW:
                    found[f"{module}.{node.name}"] = (node, argument.arg, annotation)
                    break
    return found


def _touches(name: str, functions: dict[str, tuple[ast.FunctionDef, str, str]],
             touched: dict[str, frozenset[str]], depth: int = 0) -> frozenset[str]:
    """What `name` touches of its workspace: attributes it reads, and what the service functions it hands the
    workspace to touch; anything else done with it (kept, handed to a callable we cannot see) counts as all of it."""
    if name in touched:
        return touched[name]
    function, parameter, _ = functions[name]
    if depth > 40:
        return WHOLE
    by_short = {n.rpartition(".")[2]: n for n in functions}
    uses: set[str] = set()
    handed = {id(a) for call in ast.walk(function) if isinstance(call, ast.Call)
              for a in [*call.args, *(k.value for k in call.keywords)]
              if isinstance(a, ast.Name) and a.id == parameter}
    read = {id(n.value) for n in ast.walk(function) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == parameter}
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and id(node.value) in read:
            uses.add(node.attr)
        elif isinstance(node, ast.Call):
            callee = node.func.id if isinstance(node.func, ast.Name) else None
            if any(id(a) in handed for a in [*node.args, *(k.value for k in node.keywords)]):
                uses |= _touches(by_short[callee], functions, touched, depth + 1) if callee in by_short else WHOLE
        elif isinstance(node, ast.Name) and node.id == parameter and id(node) not in handed | read \
                and isinstance(node.ctx, ast.Load):
            uses |= WHOLE  # returned, kept or compared: the whole of it
    touched[name] = frozenset(uses)
    return touched[name]
