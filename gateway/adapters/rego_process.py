"""The Rego evaluator's own process: regopy (rego-cpp) behind a pipe, so that a policy that crashes the
interpreter ends this process, never the gateway's. One JSON request per line in, one answer per line out.

Started with the policy set: `{"modules": {path: source}, "data": {...}}`, answered with the modules that
did not load. Then `{"input": ..., "queries": [...]}` answers `{"results": {query: value}, "errors": {...}}`.
The modules are loaded once: every request after that reuses them.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, TextIO

from regopy import Interpreter, RegoError
from regopy.rego_shared import rego_get_error


def serve() -> None:
    answers = os.fdopen(os.dup(1), "w")  # the protocol's own stream: what the C++ side prints goes to stderr
    os.dup2(2, 1)
    interpreter = Interpreter()
    setup = json.loads(sys.stdin.readline())
    errors = {}
    for path, source in setup["modules"].items():
        try:
            interpreter.add_module(path, source)
        except RegoError as exc:
            errors[path] = readable(str(exc), path, source)
    if setup.get("data"):
        interpreter.add_data(setup["data"])
    _answer(answers, {"module_errors": errors})
    for line in sys.stdin:
        request = json.loads(line)
        interpreter.set_input(request.get("input") or {})
        results: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for query in request["queries"]:
            try:
                output = interpreter.query(query)  # parses rego-cpp's answer, which is not always valid JSON
            except (RegoError, ValueError) as exc:
                failures[query] = f"the interpreter's answer could not be read ({type(exc).__name__}: {exc})"
                continue
            if not output.ok():  # an erroring output must never be printed: regopy crashes on it
                failures[query] = rego_get_error(interpreter._impl) or "evaluation failed"
                continue
            text = str(output)
            results[query] = None if text == "undefined" else json.loads(text)["expressions"][0]
        _answer(answers, {"results": results, "errors": failures})


_MESSAGE = re.compile(r"\(errormsg \d+:([^)]*)\)")
_WHERE = re.compile(r"\(error \d+:[^|]*\|(\d+)\|")


def readable(error: str, path: str, source: str) -> str:
    """rego-cpp's error tree (`(rego-errorseq (error 6:m.rego|54|2 (errormsg 27:...` ) as `message (file:line:col)`."""
    messages = _MESSAGE.findall(error)
    where = _WHERE.search(error)
    if not messages:
        return error.strip()
    if where is None:
        return "; ".join(messages)
    offset = int(where.group(1))
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return f"{'; '.join(messages)} ({path}:{line}:{column})"


def _answer(stream: TextIO, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


if __name__ == "__main__":
    serve()
