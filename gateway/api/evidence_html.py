"""An evidence bundle for people: the same bundle the JSON file holds, as HTML (a page of the gateway, or a file
written beside the JSON by `gateway audit sample --out`). Long lists show their count and first items; the rest is
on the page, folded, never cut."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jinja2 import Environment, PackageLoader

from gateway.domain.story import event_details

DIFF_LINES = 400  # the diff's lines shown before "and N more lines" (the rest folded below them)

_env = Environment(loader=PackageLoader("gateway.api", "templates"), autoescape=True)


def evidence_context(bundle: Mapping[str, Any]) -> dict[str, Any]:
    """What the templates show: the bundle, its story with each event's details summarised, its events' hashes."""
    contents = {e["seq"]: json.loads(e["canonical"]) for e in bundle["events"]}
    story = [{**line, "details": event_details((contents.get(line["seq"]) or {}).get("payload") or {})}
             for line in bundle["story"]]
    proven = [{"seq": e["seq"], "kind": (contents.get(e["seq"]) or {}).get("kind"), "hash": e["hash"],
               "path": e["path"]} for e in bundle["events"]]
    lines = str(bundle["diff"].get("text") or "").splitlines()
    return {"bundle": bundle, "story": story, "proven": proven, "diff_head": "\n".join(lines[:DIFF_LINES]),
            "diff_rest": "\n".join(lines[DIFF_LINES:]), "diff_rest_lines": max(0, len(lines) - DIFF_LINES)}


def evidence_html(bundle: Mapping[str, Any]) -> str:
    """The bundle as a standalone HTML file."""
    return _env.get_template("evidence_file.html").render(**evidence_context(bundle))
