"""Rego policies from main's `policies/`, evaluated by regopy in processes of their own.

The policy set of one commit of `policies/` is loaded into its evaluator processes (one per CPU, at most
`PROCESSES`) once and reused for every plan until `policies/` changes on main; each plan's queries are
shared out among them. rego-cpp can crash on some policies (and does on some inputs): the process
boundary turns that into a deny finding for the queries of that process instead of a dead worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import yaml

from gateway.adapters.git.repo import GitDeclarationRepo
from gateway.domain.errors import BackendError, ConfigError
from gateway.domain.rego import RegoModule, RegoPolicies

POLICY_DIR = "policies"
DATA_DIR = "policies/data"
TIMEOUT_SECONDS = 120.0
KEEP_EVALUATORS = 4
PROCESSES = 4  # per policy set, at most one per CPU
SHARE_FROM_BYTES = 1_000_000  # an input this big (≈ 1,000 changes) is worth a second process


def load_policies(repo: GitDeclarationRepo, sha: str) -> RegoPolicies | None:
    """The Rego modules and data under `policies/` at `sha` (None when there are no modules); read once per tree."""
    tree = repo.tree_of(sha, POLICY_DIR)
    if tree is None:
        return None
    with _evaluators_lock:
        if tree in _loaded:
            return _loaded[tree]
    policies = _read_policies(repo, sha, tree)
    with _evaluators_lock:
        _loaded[tree] = policies
        while len(_loaded) > KEEP_EVALUATORS:
            _loaded.popitem(last=False)
    return policies


_loaded: OrderedDict[str, RegoPolicies | None] = OrderedDict()  # guarded by _evaluators_lock


def _read_policies(repo: GitDeclarationRepo, sha: str, tree: str) -> RegoPolicies | None:
    files = repo.read_tree(sha, POLICY_DIR)
    modules = tuple(RegoModule(path, text) for path, text in sorted(files.items()) if path.endswith(".rego"))
    if not modules:
        return None
    data: dict[str, Any] = {}
    for path, text in sorted(files.items()):
        if not path.startswith(DATA_DIR + "/") or not path.endswith((".json", ".yaml", ".yml")):
            continue
        try:
            document = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}") from None
        if not isinstance(document, dict):
            raise ConfigError(f"{path} must hold an object: its keys are what policies read under data")
        data.update(document)
    return RegoPolicies(tree, modules, data)


@dataclass
class Evaluation:
    results: dict[str, Any] = field(default_factory=dict)  # query -> the rule's value (None: undefined)
    errors: dict[str, str] = field(default_factory=dict)  # query -> why it could not be evaluated
    module_errors: dict[str, str] = field(default_factory=dict)  # path -> why the module did not load


class RegoEvaluator:
    """One policy set, loaded once into a few regopy processes that together answer one request at a time.

    The queries of a request are shared out among the processes (as many as there are CPUs, at most
    `PROCESSES`), each of which holds every module and is handed the whole input, so that each query is
    evaluated exactly as by one interpreter: rego-cpp evaluates in one thread, and the rules are independent.
    """

    def __init__(self, policies: RegoPolicies):
        self.policies = policies
        self._lock = threading.Lock()
        self._processes: list[_EvaluatorProcess] = []
        self.module_errors: dict[str, str] = {}
        self.closed = False

    def evaluate(self, input_document: Any, queries: Sequence[str]) -> Evaluation:
        """Evaluate the queries on the input; a crash of a process is reported for each of its queries, never raised."""
        with self._lock:
            if self.closed:
                crash = "the evaluator was closed (the policies changed meanwhile); plan again"
                return Evaluation(errors=self._located({q: crash for q in queries}),
                                  module_errors=dict(self.module_errors))
            line = json.dumps({"input": input_document})  # encoded once: each process's own queries are appended
            # a small plan is answered by one process: another would cost more to hand the input than it saves
            shares = _shares(list(queries), min(_cpus(), PROCESSES) if len(line) >= SHARE_FROM_BYTES else 1)
            while len(self._processes) < len(shares):
                self._processes.append(_EvaluatorProcess(self.policies))
            answers: list[dict[str, Any] | _Crashed] = [_Crashed("the Rego interpreter gave no answer")] * len(shares)

            def ask(index: int) -> None:
                request = f'{line[:-1]}, "queries": {json.dumps(shares[index])}}}'
                try:
                    answers[index] = self._processes[index].ask(request)
                except _Crashed as exc:
                    answers[index] = exc

            helpers = [threading.Thread(target=ask, args=(i,)) for i in range(1, len(shares))]
            for helper in helpers:
                helper.start()
            try:
                ask(0)
            finally:  # the lock is held until every process has answered (or been killed by its watchdog)
                for helper in helpers:
                    helper.join()
            results: dict[str, Any] = {}
            errors: dict[str, str] = {}
            for share, answer in zip(shares, answers, strict=True):
                if isinstance(answer, _Crashed):
                    errors.update({q: str(answer) for q in share})
                else:
                    results.update(answer["results"])
                    errors.update(answer["errors"])
            self.module_errors = {path: error for p in self._processes[:len(shares)]
                                  for path, error in p.module_errors.items()}
            return Evaluation(results, self._located(errors), dict(self.module_errors))

    def _located(self, errors: dict[str, str]) -> dict[str, str]:
        return {query: self.policies.located(query, error) for query, error in errors.items()}

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for process in self._processes:
                process.stop()

    @property
    def pids(self) -> list[int]:
        """The ids of the evaluator's running processes (what the benchmark counts the CPU of)."""
        return [p.pid for p in self._processes if p.pid is not None]


def _shares(queries: list[str], processes: int) -> list[list[str]]:
    """The queries dealt out in turn to at most `processes` processes (one share when there is one query or none)."""
    count = max(1, min(processes, len(queries)))
    return [queries[i::count] for i in range(count)]


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _EvaluatorProcess:
    """One regopy process holding the whole policy set; started on first use and again after a crash."""

    def __init__(self, policies: RegoPolicies):
        self.policies = policies
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self.module_errors: dict[str, str] = {}

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def ask(self, request: str) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            self._start()
        return self._exchange(request)

    def _start(self) -> None:
        self.stop()
        self._stderr = tempfile.TemporaryFile("w+")
        self._process = subprocess.Popen([sys.executable, "-m", "gateway.adapters.policy.rego_process"], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        setup = {"modules": {m.path: m.source for m in self.policies.modules}, "data": self.policies.data}
        self.module_errors = self._exchange(json.dumps(setup))["module_errors"]

    def _exchange(self, line: str) -> dict[str, Any]:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        watchdog = threading.Timer(TIMEOUT_SECONDS, process.kill)
        watchdog.start()
        try:
            process.stdin.write(line + "\n")
            process.stdin.flush()
            answer = process.stdout.readline()
        except (BrokenPipeError, OSError):
            answer = ""
        finally:
            watchdog.cancel()
        if not answer:
            raise _Crashed(self._why_it_stopped())
        try:
            return dict(json.loads(answer))
        except ValueError:
            self.stop()
            raise _Crashed(f"the Rego interpreter answered something unreadable: {answer[:200]!r}") from None

    def _why_it_stopped(self) -> str:
        process = self._process
        code = process.wait() if process else None
        said = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            said = " ".join(self._stderr.read().split())[-300:]
        self.stop()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the Rego interpreter stopped ({how}){': ' + said if said else ''}"

    def stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                if stream:
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()
        self._process, self._stderr = None, None


class _Crashed(BackendError):
    """The interpreter process stopped or answered nonsense (the evaluator maps it to a refusal naming why)."""


_evaluators: OrderedDict[str, RegoEvaluator] = OrderedDict()
_evaluators_lock = threading.Lock()


def evaluator_for(policies: RegoPolicies) -> RegoEvaluator:
    """The evaluator of this policy set (by the tree id of `policies/`), made once per process."""
    evicted = []
    with _evaluators_lock:
        evaluator = _evaluators.get(policies.tree)
        if evaluator is None:
            evaluator = _evaluators[policies.tree] = RegoEvaluator(policies)
            while len(_evaluators) > KEEP_EVALUATORS:
                evicted.append(_evaluators.popitem(last=False)[1])
        _evaluators.move_to_end(policies.tree)
    for old in evicted:  # outside the lock: closing waits for an evaluation in progress
        old.close()
    return evaluator
