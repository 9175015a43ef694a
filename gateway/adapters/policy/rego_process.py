"""The Rego evaluator's own process: regopy (rego-cpp) behind a pipe, so that a policy that crashes the
interpreter ends this process, never the gateway's. One JSON request per line in, one answer per line out.

Started with the policy set: `{"modules": {path: source}, "data": {...}}`, answered with the modules that
did not load. Then `{"input": ..., "queries": [...]}` answers `{"results": {query: value}, "errors": {...}}`.
The modules are loaded once: every request after that reuses them.

Where the time goes on a big plan (5,000 changes, 20 rules in 4 packages: benchmarks/rego_policies.py) is
rego-cpp's own evaluation, which walks every change once per rule (about 0.13 s of CPU per rule; asking a
package's rules in one query, or through a compiled bundle, costs the same); around it, the input is handed
to rego-cpp by one walk of the decoded JSON (`set_input`, about 0.5 s), not by regopy's generic one, nor as
JSON text, both slower. The evaluator shares a plan's queries out among one such process per CPU (rego.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, TextIO

from regopy import Interpreter, RegoError
from regopy.rego_shared import rego, rego_free_input, rego_get_error, rego_new_input, rego_set_input

_INT64 = range(-(2**63), 2**63)


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
        set_input(interpreter, request.get("input") or {})
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


def set_input(interpreter: Interpreter, document: Any) -> None:
    """Hand a decoded JSON document to the interpreter as its input.

    What `Interpreter.set_input` does, in one walk that dispatches on the exact JSON types and calls
    rego-cpp's input builder directly (regopy's walk asks the abstract collection types of every value and
    copies every string once more): the same document reaches rego-cpp, in about a third of the time.
    """
    handle = rego_new_input()
    string, number, real, boolean, null = (rego.regoInputString, rego.regoInputInt, rego.regoInputFloat,
                                           rego.regoInputBoolean, rego.regoInputNull)
    item, obj, array = rego.regoInputObjectItem, rego.regoInputObject, rego.regoInputArray
    failed = 0  # rego-cpp's codes: 0 is OK

    def add(value: Any) -> None:
        nonlocal failed
        kind = type(value)
        if kind is str:
            failed |= string(handle, value.encode())
        elif kind is dict:
            for key, member in value.items():
                failed |= string(handle, key.encode())
                add(member)
                failed |= item(handle)
            failed |= obj(handle, len(value))
        elif kind is list:
            for member in value:
                add(member)
            failed |= array(handle, len(value))
        elif value is None:
            failed |= null(handle)
        elif kind is bool:
            failed |= boolean(handle, value)
        elif kind is int:
            failed |= number(handle, value) if value in _INT64 else real(handle, float(value))
        elif kind is float:
            failed |= real(handle, value)
        else:
            raise RegoError(f"cannot hand a {kind.__name__} to the interpreter")

    try:
        add(document)
        if failed:
            raise RegoError("the interpreter refused the input")
        rego_set_input(interpreter._impl, handle)  # rego-cpp keeps its own copy
    finally:
        rego_free_input(handle)


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
