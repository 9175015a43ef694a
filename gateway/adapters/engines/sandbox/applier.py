"""Applying one saved plan: exactly its changes, in dependency order, its serial raised by every step.

The applier never re-decides what to do: each instance gets the change the approved plan recorded
for it (or none), and a value that comes out other than the plan showed stops the apply. Moves go
first, then planned pure deletes (dependents first), then every instance in the order the planner
walked. Each step may meet a fault injected into the store (it fails there, leaving the apply half
done, as a real provider error would) or a delay (`DELAY_PREFIX`: the step is slow, then goes on).

What the steps do to the simulated cloud and to the state is written together, in one transaction,
when the apply ends (done or failed) and before a slow step (so what came before it can be seen):
a failed apply keeps what it did, and the cloud and the state never disagree, even when the process
dies (its unwritten steps are then lost together). One transaction, not one per step, is what makes
an apply of thousands of resources take seconds.
"""

from __future__ import annotations

import copy
import graphlib
import json
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from gateway.adapters.engines.sandbox.config import ResourceConfig, StackConfig
from gateway.adapters.engines.sandbox.evaluation import Index, Scope
from gateway.adapters.engines.sandbox.hcl_eval import Evaluator
from gateway.adapters.engines.sandbox.instances import InstanceEvaluation, proposed_attributes, state_value
from gateway.adapters.engines.sandbox.schema import in_region, plausible_value, schema_for
from gateway.adapters.engines.sandbox.state import SandboxStore, StackState, StateResource, relocated, resource_key
from gateway.adapters.engines.sandbox.values import contains_unknown, unmark
from gateway.domain.errors import ApplyError, ConfigError, PlanError
from gateway.domain.plan import ChangeKind, ResourceChange
from gateway.logs import get_logger
from gateway.ports import ApplyOutcome, StackInputs

log = get_logger(__name__)

DELAY_PREFIX = "delay:"  # a fault that slows a step down instead of failing it


def _sensitive_names(value: Mapping[str, Any]) -> list[str]:
    """The attributes whose configured values carry a sensitive or secret mark."""
    return sorted(k for k, v in value.items() if unmark(v)[1])



class PendingWrites:
    """The simulated cloud as the apply sees it: the store, under what the apply did and has not yet written."""

    def __init__(self, store: SandboxStore, stack: str, state: StackState) -> None:
        self.store = store
        self.stack = stack
        self.state = state
        self.objects: dict[tuple[str, str], dict[str, Any] | None] = {}  # None: deleted
        self.changed: set[str] = set()
        self.written_serial = state.serial  # the serial the store holds: the next write's compare-and-swap
        self.faults = store.fault_addresses(stack)

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None:
        if (rtype, rid) in self.objects:
            found = self.objects[(rtype, rid)]
            return copy.deepcopy(found) if found is not None else None
        return self.store.get_object(rtype, rid)

    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None:
        self.objects[(rtype, rid)] = dict(attributes)  # the apply never changes an object it has put: no copy

    def delete_object(self, rtype: str, rid: str) -> None:
        self.objects[(rtype, rid)] = None

    def take_fault(self, address: str) -> str | None:
        return self.store.take_fault(self.stack, address) if address in self.faults else None

    def state_changed(self, addresses: Collection[str]) -> None:
        self.changed.update(addresses)

    def flush(self) -> None:
        """Write what is pending, objects and state, in one transaction."""
        if not self.objects and not self.changed and self.state.serial == self.written_serial:
            return
        self.store.write_apply(self.stack, self.state, self.written_serial, sorted(self.changed), self.objects)
        self.objects, self.changed, self.written_serial = {}, set(), self.state.serial


class Applier(InstanceEvaluation):
    """Executes exactly the changes of one saved plan; what it did is written in one go (see the module)."""

    applying = True

    def __init__(self, stack: str, config: StackConfig, state: StackState, store: SandboxStore,
                 inputs: StackInputs, changes: tuple[ResourceChange, ...]) -> None:
        super().__init__(stack, config, inputs)
        self.state = state
        self.pending = PendingWrites(store, stack, state)
        self.store = self.pending  # data reads see the apply's own writes
        self.changes = {rc.address: rc for rc in changes}
        self.done: list[str] = []

    def run(self) -> ApplyOutcome:
        try:
            return self._run()
        finally:
            self.pending.flush()

    def _run(self) -> ApplyOutcome:
        address: str | None = None
        try:
            self._moves()
            for address in self._orphan_deletes():
                self._step(address, lambda a=address: self._delete(a))
            address = None
            for scope, resource, index, ev, address in self.instances_in_order():
                with in_region(self.region_of(scope, resource)):
                    if resource.mode == "data":
                        scope.values[resource.key][index] = self.read(scope, resource, ev, at_apply=True)[0]
                    else:
                        self._apply_instance(scope, resource, index, ev, address)
            address = None
            self._save_outputs()
        except (ApplyError, ConfigError, PlanError) as exc:
            log.warning("sandbox.apply_failed", stack=self.stack, address=address, error=str(exc))
            return ApplyOutcome(False, tuple(self.done), address, str(exc), self.state.serial)
        log.info("sandbox.apply_done", stack=self.stack, applied=len(self.done), serial=self.state.serial)
        return ApplyOutcome(True, tuple(self.done), None, None, self.state.serial)

    def _persist(self, changed: Collection[str]) -> None:
        self.state.serial += 1
        self.pending.state_changed(changed)

    def _step(self, address: str, operation: Callable[[], None]) -> None:
        fault = self.pending.take_fault(address)
        if fault and fault.startswith(DELAY_PREFIX):  # a slow provider: the step takes that long, then goes on
            self.pending.flush()
            time.sleep(float(fault[len(DELAY_PREFIX):]))
        elif fault:
            raise ApplyError(f"{address}: {fault}")
        operation()
        self._persist({address})
        self.done.append(address)

    def _moves(self) -> None:
        moved: set[str] = set()
        for rc in self.changes.values():
            if rc.previous_address and rc.previous_address in self.state.resources:
                self.state.resources[rc.address] = relocated(self.state.resources.pop(rc.previous_address), rc.address)
                moved |= {rc.address, rc.previous_address}
        if moved:
            self._persist(moved)

    def _orphan_deletes(self) -> list[str]:
        """Planned pure deletes, dependents first."""
        doomed = [a for a, rc in self.changes.items() if rc.kind == ChangeKind.DELETE]
        graph = graphlib.TopologicalSorter()
        for address in doomed:
            res = self.state.resources.get(address)
            deps = res.dependencies if res else []
            graph.add(address, *[d for d in doomed if resource_key(d) in deps])  # deps: configuration addresses
        return list(reversed(list(graph.static_order())))

    def _apply_instance(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator,
                        address: str) -> None:
        rc = self.changes.get(address)
        current = self.state.resources.get(address)
        at = (scope, resource, index, ev, address)
        if rc is None:
            if current is None:
                raise ApplyError(f"{address} is in the configuration but not in the approved plan; re-plan")
            scope.values[resource.key][index] = self.with_referenced(scope.path, resource, state_value(current))
            return
        kind = rc.kind
        if kind in (ChangeKind.NO_OP, ChangeKind.READ):
            if rc.change.importing and current is None:
                self._step(address, lambda: self._adopt(scope, resource, index, address, str(rc.change.importing["id"])))
            elif current is None:
                raise ApplyError(f"{address} vanished from state since the plan; re-plan")
            else:
                self._keep_refreshed(address, current, rc)
        elif kind == ChangeKind.CREATE:
            self._step(address, lambda: self._create(*at, rc))
        elif kind == ChangeKind.UPDATE:
            if rc.change.importing and current is None:
                self._adopt(scope, resource, index, address, str(rc.change.importing["id"]))
            self._step(address, lambda: self._update(scope, resource, ev, address, rc))
        elif kind == ChangeKind.REPLACE:
            self._step(address, lambda: (self._delete(address), self._create(*at, rc)))
        elif kind == ChangeKind.REPLACE_CREATE_FIRST:
            old = self.state.resources[address]
            self._step(address, lambda: (self._create(*at, rc),
                                         self.pending.delete_object(old.type, old.id)))
        else:
            raise ApplyError(f"{address}: the sandbox cannot apply a `{kind}` change")
        scope.values[resource.key][index] = self.with_referenced(scope.path, resource,
                                                                 state_value(self.state.resources[address]))

    def _keep_refreshed(self, address: str, current: StateResource, rc: ResourceChange) -> None:
        """As Terraform's apply does, the state takes what the plan's refresh read: drift the plan keeps is no longer
        drift. An object changed again after the plan is left as it is in state, so the next check still finds it."""
        live = self.pending.get_object(current.type, current.id)
        if live is None or live == current.attributes:
            return
        planned = rc.change.before if isinstance(rc.change.before, Mapping) else {}
        masked = rc.change.before_sensitive if isinstance(rc.change.before_sensitive, Mapping) else {}
        if any(live.get(k) != v for k, v in planned.items() if not masked.get(k)):
            return  # not what the plan saw: the apply never absorbs what it did not plan
        self.state.resources[address] = replace(current, attributes=live)
        self._persist({address})

    def _evaluate(self, resource: ResourceConfig, ev: Evaluator, address: str,
                  rc: ResourceChange) -> tuple[dict[str, Any], list[str]]:
        desired = self.desired(resource, ev)
        if contains_unknown(desired):
            raise ApplyError(f"{address}: a value is still unknown during apply")
        sensitive = sorted(set(_sensitive_names(desired)) | schema_for(resource.type).sensitive & set(desired))
        plain, _ = unmark(desired)
        self._check_consistent(address, plain, rc, frozenset(sensitive))
        return plain, sensitive

    @staticmethod
    def _check_consistent(address: str, actual: Mapping[str, Any], rc: ResourceChange,
                          sensitive: frozenset[str]) -> None:
        """Every value the approved plan showed as known must come out the same now."""
        planned = rc.change.after or {}
        unknown = rc.change.after_unknown if isinstance(rc.change.after_unknown, dict) else {}
        for name, value in actual.items():
            if name in unknown or name not in planned:
                continue
            if planned[name] != value:
                if name in sensitive:
                    raise ApplyError(f"{address}: `{name}` (sensitive) differs from the approved plan; re-plan")
                raise ApplyError(
                    f"{address}: `{name}` was planned as {json.dumps(planned[name])} but is now "
                    f"{json.dumps(value)}; the approved plan no longer matches, re-plan"
                )

    def _create(self, scope: Scope, resource: ResourceConfig, index: Index, ev: Evaluator, address: str,
                rc: ResourceChange) -> None:
        schema = schema_for(resource.type)
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        attrs = {**schema.defaults, **attrs}
        rid = schema.make_id(attrs, f"{self.stack}/{address}/{secrets.token_hex(8)}")
        attrs["id"] = rid
        for name, compute in schema.computed.items():
            if attrs.get(name) is None:
                try:
                    attrs[name] = compute(attrs, rid)
                except (KeyError, ValueError, TypeError, AttributeError):  # the configuration lacks what it uses
                    attrs[name] = plausible_value(resource.type, name, rid, attrs)
        for name in sorted(self.referenced_attributes(scope.path, resource)):
            if attrs.get(name) is None:
                attrs[name] = plausible_value(resource.type, name, rid, attrs)
        named = bool(schema.id_from and attrs.get(schema.id_from))  # a random id cannot be taken: only a name can
        if named and rc.kind != ChangeKind.REPLACE_CREATE_FIRST and self.pending.get_object(resource.type, rid):
            raise ApplyError(f"{address}: a {resource.type} with id {rid!r} already exists in the simulated cloud")
        self.pending.put_object(resource.type, rid, attrs)
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, attrs, sensitive, self.dependencies(scope.path, resource),
            scope.address,
        )

    def _update(self, scope: Scope, resource: ResourceConfig, ev: Evaluator, address: str, rc: ResourceChange) -> None:
        current = self.state.resources[address]
        attrs, sensitive = self._evaluate(resource, ev, address, rc)
        merged = proposed_attributes(resource, current.attributes, attrs, self.referenced_attributes(scope.path, resource))
        self.pending.put_object(current.type, current.id, merged)
        self.state.resources[address] = StateResource(
            current.type, current.name, current.index, current.id, merged, sensitive,
            self.dependencies(scope.path, resource), scope.address,
        )

    def _adopt(self, scope: Scope, resource: ResourceConfig, index: Index, address: str, rid: str) -> None:
        live = self.pending.get_object(resource.type, rid)
        if live is None:
            raise ApplyError(f"{address}: the object to import ({rid!r}) no longer exists")
        self.state.resources[address] = StateResource(
            resource.type, resource.name, index, rid, copy.deepcopy(live), [], self.dependencies(scope.path, resource),
            scope.address,
        )

    def _delete(self, address: str) -> None:
        res = self.state.resources.pop(address)
        self.pending.delete_object(res.type, res.id)

    def _save_outputs(self) -> None:
        outputs: dict[str, Any] = {}
        for name, (value, declared) in self.outputs().items():
            plain, mark = unmark(value)
            outputs[name] = {"value": plain, "sensitive": declared or bool(mark)}
        if outputs != self.state.outputs:
            self.state.outputs = outputs
            self._persist(())
