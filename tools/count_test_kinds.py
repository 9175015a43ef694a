"""How many test functions need a workspace (git, a database, an engine, a subprocess) and how many run on fakes or
on the pure domain: the measure of issue #41's "at least half of the test functions run on fakes".

    python tools/count_test_kinds.py [CHECKOUT]      # CHECKOUT: a checkout of the gateway (default: this one)

It collects the suite as pytest does (`pytest --collect-only`, in this process) and counts test functions (a parametrized function is one, as
 heavy as its heaviest case) and collected items (each case one)
and classifies each item by reading source, statically, nothing run:

- workspace: the test, a module-level function it calls (three calls deep), or a fixture it uses (pytest's own
  closure of fixtures, each read the same way) builds one: `make_workspace`, `create_workspace`, a `Database`,
  `SqlStore`, a SQLAlchemy engine, a git repository, a `gateway` subprocess (`run_cli`, `subprocess`), the app
  (`create_app`), the wheel or an image. A parametrized fixture whose case for this item is "fake" does not count.
- fakes: not a workspace, and it uses tests/fakes.py (a `Fake…` class, or `fake_workspace`, `forge_workspace`,
  `sandbox_workspace`, `sample_people`, which build one).
- pure: neither: the domain, parsers and renderers on values.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HEAVY = re.compile(r"\b(make_workspace|create_workspace|bootstrap_simulator|run_cli|Database|SqlStore|create_engine|"
                   r"git\.Repo|Repo\.init|subprocess|create_app|docker|build_wheel)\b")
FAKE = re.compile(r"\b(Fake[A-Z]\w*|fake_workspace|forge_workspace|sandbox_workspace|sample_people)\b")
FAKE_PARAMS = {"fake"}
ORDER = ("workspace", "fakes", "pure")


def _source(func: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return ""


def _called_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _reach(func: Any, depth: int = 3) -> str:
    """The function's source and that of the module-level functions and classes it calls, `depth` calls deep."""
    module = sys.modules.get(getattr(func, "__module__", ""), None)
    seen, sources, frontier = {func}, [_source(func)], [func]
    for _ in range(depth):
        nxt = []
        for f in frontier:
            for name in _called_names(_source(f)):
                target = getattr(module, name, None)
                if (inspect.isfunction(target) or inspect.isclass(target)) and target not in seen \
                        and getattr(target, "__module__", None) == getattr(module, "__name__", None):
                    seen.add(target)
                    sources.append(_source(target))
                    nxt.append(target)
        frontier = nxt
    return "\n".join(sources)


def classify(item: pytest.Item) -> str:
    """workspace, fakes or pure (see the module's docstring)."""
    texts = [_reach(getattr(item, "obj", None))]
    params = getattr(getattr(item, "callspec", None), "params", {})
    faked = False
    for name, defs in item._fixtureinfo.name2fixturedefs.items():  # type: ignore[attr-defined]
        if isinstance(params.get(name), str) and params[name] in FAKE_PARAMS:
            faked = True  # this case of the fixture is the fake one
            continue
        texts += [_reach(d.func) for d in defs]
    text = "\n".join(texts)
    if HEAVY.search(text):
        return "workspace"
    return "fakes" if faked or FAKE.search(text) else "pure"


class _Classifier:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.functions: dict[str, str] = {}  # a test function (its cases together): the heaviest kind of its cases

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            kind = classify(item)
            self.kinds[kind] += 1
            function = item.nodeid.split("[")[0]
            self.functions[function] = min(kind, self.functions.get(function, kind), key=ORDER.index)


def main(argv: list[str]) -> int:
    checkout = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    classifier = _Classifier()
    code = pytest.main(["--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "tests"],
                       plugins=[classifier])
    if code not in (0, 5):
        print(f"collection failed ({code})", file=sys.stderr)
        return int(code)
    print(f"\n{checkout}")
    _print("test functions", Counter(classifier.functions.values()))
    _print("collected items (each parametrized case)", classifier.kinds)
    return 0


def _print(what: str, kinds: Counter[str]) -> None:
    total = sum(kinds.values())
    print(f"{what}: {total}")
    for kind in ORDER:
        print(f"  {kind:<10} {kinds[kind]:>5}  {100 * kinds[kind] / max(total, 1):5.1f}%")
    print(f"  no workspace (fakes + pure): {total - kinds['workspace']} of {total}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
