"""What plan and apply both do to a resource instance: evaluate its block, read data, see references.

The planner and the applier walk the same scopes (`evaluation.py` orders them); both evaluate a
block's body the same way (dynamic blocks expanded, errors naming the attribute's line), read data
sources the same way, lay configured attributes over prior ones the same way, and hand references
the same open-ended object. That shared half lives here, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from gateway.adapters.engines.sandbox.config import Body, ResourceConfig, traversal_text
from gateway.adapters.engines.sandbox.data_sources import data_object_id, read_data, unsimulated_data
from gateway.adapters.engines.sandbox.evaluation import Evaluation, Path_, Scope
from gateway.adapters.engines.sandbox.hcl_eval import Evaluator, MaskedFailure
from gateway.adapters.engines.sandbox.schema import plausible_value, region, schema_for
from gateway.adapters.engines.sandbox.state import StateResource
from gateway.adapters.engines.sandbox.values import UNKNOWN, Secret, contains_unknown, marked, unmark
from gateway.adapters.hcl.reading import line_of
from gateway.domain.errors import ConfigError


class CloudObjects(Protocol):
    """The simulated cloud's objects as plan and apply read them (the apply's own writes included)."""

    def get_object(self, rtype: str, rid: str) -> dict[str, Any] | None: ...
    def put_object(self, rtype: str, rid: str, attributes: Mapping[str, Any]) -> None: ...


class InstanceEvaluation(Evaluation):
    """What plan and apply add to the shared scopes: block bodies, data reads and outputs."""

    store: CloudObjects

    def evaluator(self, where: str, **extra: Any) -> Evaluator:
        return self.root.evaluator(where, **extra)

    def desired(self, resource: ResourceConfig, ev: Evaluator) -> dict[str, Any]:
        """The instance's configured attributes, nested blocks (dynamic ones expanded) as lists of objects.

        An error names the line of the attribute it comes from, not only the block's.
        """
        block_at = f"{resource.file}:{resource.line}:"
        if block_at not in ev.where:
            return eval_body(resource.body, ev)
        return eval_body(resource.body, ev, lambda line: ev.where.replace(block_at, f"{resource.file}:{line}:", 1))

    def outputs(self) -> dict[str, tuple[Any, bool]]:
        return {name: (self.root.output(name), out.sensitive) for name, out in self.config.outputs.items()}

    def referenced_attributes(self, path: Path_, resource: ResourceConfig) -> set[str]:
        """Attributes of this block that expressions read: each must have a value, known or not."""
        return self.referenced.get(path, {}).get(resource.key, set())

    def with_referenced(self, path: Path_, resource: ResourceConfig, value: dict[str, Any]) -> ResourceObject:
        """An object as references see it: an attribute it does not hold is unknown while its id is,
        then plausible (the schema table is not the provider's whole schema)."""
        rid, _ = unmark(value.get("id"))
        if rid is UNKNOWN:
            return ResourceObject(_open_blocks(resource, value, None, ""), lambda name: UNKNOWN)
        here = region()  # read later, from another instance's evaluation: its values stay in its own region
        missing = self.referenced_attributes(path, resource) - {k for k, v in value.items() if v is not None}
        filled = {**value, **{k: plausible_value(resource.type, k, str(rid), value, here) for k in missing}}
        filled = _open_blocks(resource, filled, str(rid), here)
        return ResourceObject(filled, lambda name: plausible_value(resource.type, name, str(rid), filled, here))

    def read(self, scope: Scope, resource: ResourceConfig, ev: Evaluator, at_apply: bool) -> tuple[Any, Any]:
        """(the data source's value, its arguments); the value is UNKNOWN until its arguments are known."""
        args = self.desired(resource, ev)
        if contains_unknown(args):
            return UNKNOWN, args
        plain, mark = unmark(args)
        try:
            value = read_data(resource.type, plain, self.store.get_object)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(f"{ev.where}: {exc}") from None
        if value is None:  # not simulated: unknown until an apply has read it once (kept like an object)
            kind, rid = f"data.{resource.type}", data_object_id(plain)
            seen = self.store.get_object(kind, rid) is not None
            if not seen and not at_apply:
                return UNKNOWN, args
            value = unsimulated_data(resource.type, plain, self.referenced_attributes(scope.path, resource))
            if not seen:
                self.store.put_object(kind, rid, plain)
        return marked(self.with_referenced(scope.path, resource, value), mark), args


class ResourceObject(dict[str, Any]):
    """A resource's or data source's attributes, open to any attribute name.

    Expressions may read attributes the schema table does not list (`v.arn` in a for expression
    over a resource's instances): the evaluator asks `name in obj`, then `obj[name]`, and gets the
    value `missing(name)` gives instead of an error. Everything else sees the stored attributes.
    """

    def __init__(self, attributes: Mapping[str, Any], missing: Callable[[str], Any]) -> None:
        super().__init__(attributes)
        self.missing = missing

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> Any:
        return self.missing(name)


def _open_blocks(resource: ResourceConfig, value: dict[str, Any], rid: str | None, where: str) -> dict[str, Any]:
    """Nested blocks as references see them: an attribute the provider computes inside a block
    (`vpc_config[0].cluster_security_group_id`) is unknown while the object's id is, then plausible."""
    types = {t if t != "dynamic" else b.labels[0] for t, b in resource.body.blocks if t != "dynamic" or b.labels}
    opened = dict(value)
    for block_type in types & value.keys():
        items = value[block_type]
        if not isinstance(items, list):
            continue
        seed = f"{rid}/{block_type}"  # the same for every item: what it makes up does not tell items apart
        opened[block_type] = [
            ResourceObject(item, (lambda name: UNKNOWN) if rid is None else
                           (lambda name, item=item, seed=seed: plausible_value(resource.type, name, seed, item, where)))
            if type(item) is dict else item for item in items]
    return opened


def eval_body(body: Body, ev: Evaluator, where_at: Callable[[int], str] | None = None) -> dict[str, Any]:
    """A block body's values; `where_at(line)` names a line in errors (the attribute's)."""
    out: dict[str, Any] = {}
    for name, tree in body.attributes.items():
        try:
            out[name] = ev.eval(tree)
        except ConfigError as exc:
            if where_at is None:
                raise
            raise _located(exc, ev.where, where_at(line_of(tree))) from None
    for block_type, block in body.blocks:
        if block_type == "dynamic":
            _eval_dynamic(block, ev, out)
        elif out.get(block_type) is not UNKNOWN:
            out.setdefault(block_type, []).append(eval_body(block, ev, where_at))
    return out


def _located(exc: ConfigError, where: str, located: str) -> ConfigError:
    """The same error, naming the attribute's line instead of the block's (a masked failure stays masked)."""
    message = str(exc)
    if not message.startswith(where):
        return exc  # raised elsewhere (a local, a variable): it names its own line
    message = located + message[len(where):]
    return MaskedFailure(message, exc.mark) if isinstance(exc, MaskedFailure) else ConfigError(message)


def _eval_dynamic(block: Body, ev: Evaluator, out: dict[str, Any]) -> None:
    """A `dynamic "x"` block: one `x` block per item of for_each, its `content` evaluated with the iterator."""
    if len(block.labels) != 1:
        raise ConfigError(f"{ev.where}: line {block.line}: a dynamic block takes one label, the block type")
    label = block.labels[0]
    content = next((b for t, b in block.blocks if t == "content"), None)
    if "for_each" not in block.attributes or content is None:
        raise ConfigError(f"{ev.where}: line {block.line}: dynamic \"{label}\" needs for_each and a content block")
    iterator = traversal_text(block.attributes["iterator"], ev.where) if "iterator" in block.attributes else label
    items, mark = unmark(ev.eval(block.attributes["for_each"]))
    if items is UNKNOWN or (isinstance(items, list) and contains_unknown(items) and not items):
        out[label] = UNKNOWN  # how many blocks there will be is known only after apply
        return
    if items is None:
        raise ConfigError(f"{ev.where}: line {block.line}: dynamic \"{label}\": for_each cannot be null")
    blocks = out.setdefault(label, [])
    if blocks is UNKNOWN:
        return
    pairs = items.items() if isinstance(items, dict) else enumerate(items)
    for key, value in pairs:
        child = ev.child(**{iterator: {"key": marked(key, mark), "value": marked(value, mark)}})
        blocks.append(marked(eval_body(content, child), mark))


def proposed_attributes(resource: ResourceConfig, prior: Mapping[str, Any], desired: Mapping[str, Any],
                        computed: Collection[str] = ()) -> dict[str, Any]:
    """Prior attributes overlaid with config; unset optional ones fall back to their defaults."""
    schema = schema_for(resource.type)
    keep = {"id", *schema.computed, *computed}
    proposed = {k: (v if k in keep else schema.defaults.get(k)) for k, v in prior.items()}
    # an attribute the provider computes keeps its value while the configuration leaves it null
    proposed.update({k: v for k, v in desired.items() if unmark(v)[0] is not None or k not in keep})
    ignore = resource.lifecycle.ignore_changes
    for name in (prior if ignore is None else ignore):
        if name in prior:
            proposed[name] = prior[name]
    return {k: v for k, v in proposed.items() if v is not None or k in desired or k in keep}


def mark_sensitive(attrs: Mapping[str, Any], names: set[str] | frozenset[str]) -> dict[str, Any]:
    """Mark the named attributes secret: the schema or the state says so, whatever the configuration says."""
    return {k: Secret(v) if k in names and not isinstance(v, Secret) else v for k, v in attrs.items()}


def state_value(res: StateResource) -> dict[str, Any]:
    """A resource's attributes as references see them: what was sensitive when applied stays masked."""
    return mark_sensitive(res.attributes, set(res.sensitive_attributes) | schema_for(res.type).sensitive)

