"""Cut the small subsets of GitHub's REST and webhook descriptions that the tests' fake GitHub is checked against.

Inputs: GitHub's published descriptions as packaged by octokit (``@octokit/openapi`` 23.0.2,
``generated/api.github.com.json``, OpenAPI 3.0; ``@octokit/openapi-webhooks`` 12.1.0, OpenAPI 3.1), both MIT.
They are large (13 MB and 5 MB) and are not part of the project; this script writes only what the tests use:

- ``tests/fixtures/github/rest-subset.json``: for each REST operation the fake serves, the JSON Schema of the
  request body and of the response body of each status code it returns;
- ``tests/fixtures/github/webhooks-subset.json``: the payload schema of each webhook (event, action) the gateway
  handles.

Every schema is turned into plain JSON Schema (draft 2020-12): OpenAPI 3.0 ``nullable: true`` becomes a ``"null"``
type (or an ``anyOf`` with ``{"type": "null"}``), annotations (descriptions, examples, titles, ...) are dropped, and
the components a schema references, transitively, are kept under the subset's own ``components.schemas`` map so that
``#/components/schemas/...`` references keep working. Sub-schemas that occur several times are stored once.

Usage: ``python tools/extract_github_schemas.py [REST_JSON [WEBHOOKS_JSON]]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "fixtures" / "github" / "openapi"
DEFAULT_REST = SHARED / "rest-api.github.com.json"
DEFAULT_WEBHOOKS = SHARED / "webhooks.api.github.com.json"
OUT_DIR = ROOT / "tests" / "fixtures" / "github"

# (method, path template) -> the status codes the fake answers with. 204 means "no body".
REST_OPERATIONS: dict[tuple[str, str], tuple[int, ...]] = {
    ("GET", "/app"): (200,),
    ("POST", "/app/installations/{installation_id}/access_tokens"): (201, 401, 403, 404, 422),
    ("GET", "/user"): (200, 401, 403),
    ("GET", "/users/{username}"): (200, 404),
    ("GET", "/orgs/{org}"): (200, 404),
    ("GET", "/orgs/{org}/teams/{team_slug}"): (200, 404),
    ("GET", "/orgs/{org}/teams/{team_slug}/memberships/{username}"): (200, 404),
    ("GET", "/orgs/{org}/teams/{team_slug}/members"): (200,),
    ("GET", "/teams/{team_id}/members/{username}"): (204, 404),
    ("GET", "/repos/{owner}/{repo}"): (200, 404),
    ("GET", "/repos/{owner}/{repo}/installation"): (200, 404),
    ("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission"): (200, 404),
    ("GET", "/repos/{owner}/{repo}/git/ref/{ref}"): (200, 404),
    ("DELETE", "/repos/{owner}/{repo}/git/refs/{ref}"): (204, 422),
    ("GET", "/repos/{owner}/{repo}/pulls"): (200, 422),
    ("POST", "/repos/{owner}/{repo}/pulls"): (201, 403, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}"): (200, 404),
    ("PATCH", "/repos/{owner}/{repo}/pulls/{pull_number}"): (200, 403, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/files"): (200, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/commits"): (200,),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/merge"): (204, 404),
    ("PUT", "/repos/{owner}/{repo}/pulls/{pull_number}/merge"): (200, 403, 404, 405, 409, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"): (200,),
    ("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"): (200, 403, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}"): (200, 404),
    ("PUT", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews/{review_id}/dismissals"): (200, 404, 422),
    ("GET", "/repos/{owner}/{repo}/pulls/{pull_number}/requested_reviewers"): (200,),
    ("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/requested_reviewers"): (201, 403, 422),
    ("GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"): (200, 404),
    ("POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"): (201, 403, 404, 422),
    ("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}"): (200, 404),
    ("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}"): (200, 422),
    ("DELETE", "/repos/{owner}/{repo}/issues/comments/{comment_id}"): (204,),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}"): (200, 404, 422),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}/statuses"): (200,),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}/status"): (200, 404),
    ("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs"): (200,),
    ("POST", "/repos/{owner}/{repo}/statuses/{sha}"): (201,),
    ("POST", "/repos/{owner}/{repo}/check-runs"): (201,),
    ("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}"): (200,),
    ("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"): (200,),
}
# Error bodies of status codes an operation does not describe (e.g. 401, or 403 for check runs written with a PAT).
REST_EXTRA_COMPONENTS = ("basic-error", "validation-error")

# (X-GitHub-Event, action or None) -> key of the webhook in the description.
WEBHOOKS: dict[tuple[str, str | None], str] = {
    ("pull_request", "opened"): "pull-request-opened",
    ("pull_request", "reopened"): "pull-request-reopened",
    ("pull_request", "synchronize"): "pull-request-synchronize",
    ("pull_request", "closed"): "pull-request-closed",
    ("pull_request_review", "submitted"): "pull-request-review-submitted",
    ("pull_request_review", "dismissed"): "pull-request-review-dismissed",
    ("issue_comment", "created"): "issue-comment-created",
    ("issue_comment", "edited"): "issue-comment-edited",
    ("push", None): "push",
    ("ping", None): "ping",
}

# Schema keywords kept; everything else on a schema object (description, example(s), title, default, readOnly,
# deprecated, discriminator, x-*, ...) is an annotation and dropped. "nullable" is rewritten, not kept.
KEPT_KEYWORDS = frozenset(
    {
        "$ref", "type", "enum", "const", "format", "pattern",
        "properties", "required", "additionalProperties", "patternProperties",
        "minProperties", "maxProperties", "items", "minItems", "maxItems", "uniqueItems",
        "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "allOf", "anyOf", "oneOf", "not",
    }
)  # fmt: skip
SCHEMA_PREFIX = "#/components/schemas/"
SHARED_PREFIX = "shared-"
# Sub-schemas whose JSON is at least this long and that occur at least twice are stored once.
DEDUPE_MIN_CHARS = 400

JsonObj = dict[str, Any]


def to_json_schema(schema: Any, *, openapi30: bool) -> Any:
    """One OpenAPI schema object (recursively) as plain JSON Schema without annotations."""
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema and openapi30:
        # OpenAPI 3.0: a $ref's sibling keywords are ignored.
        out: JsonObj = {"$ref": schema["$ref"]}
    else:
        out = {}
        for key, value in schema.items():
            if key not in KEPT_KEYWORDS:
                continue
            if key in ("properties", "patternProperties"):
                out[key] = {name: to_json_schema(sub, openapi30=openapi30) for name, sub in value.items()}
            elif key in ("allOf", "anyOf", "oneOf"):
                out[key] = [to_json_schema(sub, openapi30=openapi30) for sub in value]
            elif key in ("items", "additionalProperties", "not"):
                out[key] = to_json_schema(value, openapi30=openapi30)
            else:
                out[key] = value
    if openapi30 and schema.get("nullable") is True:
        out = _nullable(out)
    return out


def _nullable(schema: JsonObj) -> JsonObj:
    if "type" in schema and "$ref" not in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        schema = {**schema, "type": [*types, "null"] if "null" not in types else types}
        if "enum" in schema and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
        return schema
    return {"anyOf": [{"type": "null"}, schema]}


def referenced(schema: Any) -> set[str]:
    """Names of the components a schema references directly."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                if not ref.startswith(SCHEMA_PREFIX):
                    raise ValueError(f"unsupported reference {ref}")
                found.add(ref.removeprefix(SCHEMA_PREFIX))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def closure(roots: list[Any], components: JsonObj, *, openapi30: bool) -> JsonObj:
    """The converted components the roots reference, transitively."""
    kept: JsonObj = {}
    todo = sorted(set().union(*(referenced(root) for root in roots)))
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = to_json_schema(components[name], openapi30=openapi30)
        todo.extend(sorted(referenced(kept[name]) - kept.keys()))
    return dict(sorted(kept.items()))


def subschemas(schema: Any) -> list[tuple[tuple[str, ...], Any]]:
    """The direct sub-schemas of a schema, each with its path of keys inside it."""
    if not isinstance(schema, dict):
        return []
    found: list[tuple[tuple[str, ...], Any]] = []
    for key, value in schema.items():
        if key in ("properties", "patternProperties"):
            found.extend(((key, name), sub) for name, sub in value.items())
        elif key in ("allOf", "anyOf", "oneOf"):
            found.extend(((key, str(i)), sub) for i, sub in enumerate(value))
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            found.append(((key,), value))
    return found


def map_schema(schema: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied bottom-up to a schema and all its sub-schemas."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for path, sub in subschemas(schema):
        container: Any = out
        for part in path[:-1]:
            container[part] = container[part].copy()
            container = container[part]
        if isinstance(container, list):
            container[int(path[-1])] = map_schema(sub, fn)
        else:
            container[path[-1]] = map_schema(sub, fn)
    return fn(out)


def large_subschema_counts(schemas: Iterable[Any]) -> Counter[str]:
    """How often each large sub-schema (as canonical JSON) occurs in ``schemas``."""
    counts: Counter[str] = Counter()

    def count(schema: Any) -> Any:
        if isinstance(schema, dict) and "$ref" not in schema:
            text = json.dumps(schema, sort_keys=True)
            if len(text) >= DEDUPE_MIN_CHARS:
                counts[text] += 1
        return schema

    for schema in schemas:
        map_schema(schema, count)
    return counts


def replace_subschema(schema: Any, target: JsonObj, replacement: JsonObj) -> Any:
    return map_schema(schema, lambda sub: replacement if sub == target else sub)


def dedupe(roots: JsonObj, components: JsonObj) -> None:
    """Store large sub-schemas that occur more than once once, in ``components``; ``roots`` maps names to schemas.

    Both dicts are changed in place.
    """
    while True:
        counts = large_subschema_counts([*roots.values(), *components.values()])
        repeated = [text for text, n in counts.items() if n > 1]
        if not repeated:
            return
        # Hoist the largest first: the repeats inside it are then counted once, in the hoisted copy.
        text = max(repeated, key=len)
        target = json.loads(text)
        name = SHARED_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:12]
        ref = {"$ref": SCHEMA_PREFIX + name}
        for mapping in (roots, components):
            for key, schema in mapping.items():
                mapping[key] = replace_subschema(schema, target, ref)
        components[name] = target


def _json_schema_of(content_owner: JsonObj, where: str) -> Any:
    content = content_owner.get("content") or {}
    if not content:
        return None
    if "application/json" not in content:
        raise ValueError(f"{where}: no application/json content ({sorted(content)})")
    return content["application/json"]["schema"]


def rest_subset(description: JsonObj) -> JsonObj:
    components = description["components"]
    operations: JsonObj = {}
    schemas: JsonObj = {}  # "<METHOD> <template> <status|request>" -> schema, deduplicated below
    for (method, template), statuses in REST_OPERATIONS.items():
        operation = description["paths"][template][method.lower()]
        name = f"{method} {template}"
        operations[name] = {"operationId": operation["operationId"], "request": None, "responses": {}}
        request = operation.get("requestBody")
        if request is not None and "$ref" in request:
            request = components["requestBodies"][request["$ref"].rsplit("/", 1)[-1]]
        request_schema = None if request is None else _json_schema_of(request, f"{name} request")
        if request_schema is not None:
            schemas[f"{name} request"] = to_json_schema(request_schema, openapi30=True)
        for status in statuses:
            response = operation["responses"].get(str(status))
            if response is None:
                raise ValueError(f"{name} describes no {status} response")
            if "$ref" in response:
                response = components["responses"][response["$ref"].rsplit("/", 1)[-1]]
            schema = _json_schema_of(response, f"{name} {status}")
            operations[name]["responses"][str(status)] = None
            if schema is not None:
                schemas[f"{name} {status}"] = to_json_schema(schema, openapi30=True)
    roots = [*schemas.values(), *({"$ref": SCHEMA_PREFIX + name} for name in REST_EXTRA_COMPONENTS)]
    kept = closure(roots, components["schemas"], openapi30=True)
    dedupe(schemas, kept)
    for key, schema in schemas.items():
        name, part = key.rsplit(" ", 1)
        if part == "request":
            operations[name]["request"] = schema
        else:
            operations[name]["responses"][part] = schema
    return {
        "source": _source("@octokit/openapi", description),
        "operations": operations,
        "components": {"schemas": dict(sorted(kept.items()))},
    }


def webhooks_subset(description: JsonObj) -> JsonObj:
    webhooks: JsonObj = {}
    for (event, action), key in WEBHOOKS.items():
        body = description["webhooks"][key]["post"]["requestBody"]
        schema = to_json_schema(_json_schema_of(body, key), openapi30=False)
        webhooks[event if action is None else f"{event}.{action}"] = schema
    kept = closure(list(webhooks.values()), description["components"]["schemas"], openapi30=False)
    dedupe(webhooks, kept)
    return {
        "source": _source("@octokit/openapi-webhooks", description),
        "webhooks": webhooks,
        "components": {"schemas": dict(sorted(kept.items()))},
    }


def _source(package: str, description: JsonObj) -> JsonObj:
    return {
        "package": package,
        "version": description["info"]["version"],
        "file": "generated/api.github.com.json",
        "license": "MIT",
        "made_by": "tools/extract_github_schemas.py",
    }


def write(document: JsonObj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, separators=(",", ":"), sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({path.stat().st_size:,} bytes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rest", nargs="?", type=Path, default=DEFAULT_REST, help="@octokit/openapi api.github.com.json")
    parser.add_argument(
        "webhooks", nargs="?", type=Path, default=DEFAULT_WEBHOOKS, help="@octokit/openapi-webhooks api.github.com.json"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default tests/fixtures/github)")
    args = parser.parse_args(argv)
    write(rest_subset(json.loads(args.rest.read_text(encoding="utf-8"))), args.out / "rest-subset.json")
    write(webhooks_subset(json.loads(args.webhooks.read_text(encoding="utf-8"))), args.out / "webhooks-subset.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
