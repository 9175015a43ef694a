"""The stored form of a preview: byte for byte what it was when it was written with `dataclasses.asdict`.

Stored previews are served as they are (and compared, and hashed into nothing else): the serializer written out
by hand for speed must give the same bytes, for every field of every part of a preview.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from gateway.domain.plan import ChangeKind, decode_plan_bytes, load_plan
from gateway.domain.policy import Finding, Severity
from gateway.domain.preview import (
    NO_CHANGES,
    AttributeDiff,
    DriftEntry,
    ModuleVersion,
    OpenDrift,
    Preview,
    ResourceEntry,
    _count_line,
    build_preview,
    preview_from_json,
    preview_to_json,
    render_json,
)
from gateway.domain.risk import Risk, RiskLevel

from .conftest import FIXTURES

PLAN_FILES = sorted((FIXTURES / "tfplan").glob("*.json"))


def as_written_before(preview: Preview) -> dict[str, Any]:
    data = asdict(preview)
    data["has_changes"] = preview.has_changes
    data["summary"] = _count_line(preview) if preview.has_changes else NO_CHANGES
    return data


def rich_preview() -> Preview:
    """Every field of every part set, none at its default, with text JSON must escape."""
    diff = AttributeDiff("tags[\"é\"]", '"old\\n"', None)
    entry = ResourceEntry("module.a[\"k\"].aws_db_instance.main", ChangeKind.REPLACE, "replace (destroy, then create)",
                          "`engine` forces replacement", (diff, AttributeDiff("id", None, "(known after apply)")),
                          previous_address="aws_db_instance.old", importing_id="db-1")
    drift = DriftEntry("aws_s3_bucket.logs", "changed outside the gateway; this apply would revert it", True,
                       (AttributeDiff("acl", '"private"', '"public-read"'),))
    return Preview(
        engine="terraform 1.0.3", counts={"replace": 1, "create": 2, "moved": 1, "import": 1},
        danger=(entry,), drift=(drift,), changes=(entry, ResourceEntry("null_resource.n", ChangeKind.CREATE, "create",
                                                                       None, ())),
        outputs=(AttributeDiff("url", None, "(sensitive)"),),
        risk=Risk(RiskLevel.HIGH, ("destroys a stateful resource", "✓ unicode")),
        findings=(Finding("max-deletes", Severity.DENY, "aws_db_instance.main", "too many </script>", "data"),),
        open_drift=(OpenDrift(7, "2026-12-02T18:00:00+00:00", True, (drift,), (drift,), (drift,)),),
        notices=("imports x (id 1) with zero diff",),
        modules=(ModuleVersion("vpc", "git::https://example.com/vpc.git?ref=v1", "a" * 40, "sha256:00"),),
    )


def test_a_rich_preview_is_stored_byte_for_byte_as_before() -> None:
    preview = rich_preview()
    expected = json.dumps(as_written_before(preview), separators=(",", ":"), ensure_ascii=False, default=str)
    assert preview_to_json(preview) == expected
    assert render_json(preview) == json.dumps(as_written_before(preview), indent=2, ensure_ascii=False,
                                              default=str) + "\n"
    assert preview_from_json(preview_to_json(preview)) == preview


def test_an_empty_preview_is_stored_as_before() -> None:
    preview = Preview("sandbox", {}, (), (), (), ())
    assert preview_to_json(preview) == json.dumps(as_written_before(preview), separators=(",", ":"),
                                                  ensure_ascii=False, default=str)


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: p.name)
def test_every_real_plan_preview_is_stored_as_before(path: Path) -> None:
    preview = build_preview(load_plan(decode_plan_bytes(path.read_bytes())),
                            findings=(Finding("r", Severity.WARN, "a", "m"),), risk=Risk(RiskLevel.LOW, ()))
    assert preview_to_json(preview) == json.dumps(as_written_before(preview), separators=(",", ":"),
                                                  ensure_ascii=False, default=str)
