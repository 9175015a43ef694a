"""The plan reader and the preview, on real `show -json` output from public repositories."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.domain.errors import PlanFormatError
from gateway.domain.plan import ChangeKind, decode_plan_bytes, iter_leaves, load_plan, mask_at
from gateway.domain.preview import NO_CHANGES, RENDERERS, build_preview, preview_from_json, render_markdown, render_text

from .conftest import FIXTURES

PLAN_FILES = sorted((FIXTURES / "tfplan").glob("*.json"))


def load_fixture(path: Path) -> dict[str, Any]:
    return decode_plan_bytes(path.read_bytes())


def sensitive_values(document: dict[str, Any]) -> set[str]:
    """Every leaf a sensitive mask covers, as the text a leak would show."""
    found = set()
    for section in ("resource_changes", "resource_drift"):
        for rc in document.get(section) or []:
            change = rc["change"]
            for side, mask in (("before", "before_sensitive"), ("after", "after_sensitive")):
                for path, value in iter_leaves(change.get(side)):
                    if mask_at(change.get(mask, False), path) and value not in (None, "", True, False):
                        found.add(str(value))
    return found


def test_every_fixture_is_a_real_plan_worth_testing() -> None:
    assert len(PLAN_FILES) >= 7


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: p.name)
def test_every_real_plan_loads_with_typed_changes(path: Path) -> None:
    document = load_fixture(path)
    plan = load_plan(document)
    assert len(plan.resource_changes) == len(document.get("resource_changes") or [])
    for rc, raw in zip(plan.resource_changes, document["resource_changes"], strict=True):
        assert rc.address == raw["address"]
        assert list(rc.change.actions) == raw["change"]["actions"]
        assert rc.kind in ChangeKind


@pytest.mark.parametrize("path", PLAN_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", sorted(RENDERERS))
def test_every_real_plan_renders_without_leaking_a_sensitive_value(path: Path, fmt: str) -> None:
    document = load_fixture(path)
    output = RENDERERS[fmt](build_preview(load_plan(document)))
    assert output.strip()
    for secret in sensitive_values(document):
        assert secret not in output, f"sensitive value {secret[:4]}… leaked in {fmt}"


def test_sensitive_fixture_really_has_clear_text_secrets_to_hide() -> None:
    document = load_fixture(FIXTURES / "tfplan/tf-plan-format_sensitive.tfplan.json")
    secrets = sensitive_values(document)
    assert len(secrets) >= 2  # base64 and hex of random_bytes, in clear in `before`
    text = render_text(build_preview(load_plan(document)))
    assert "base64: (sensitive) -> (sensitive)" in text


def test_replacement_names_the_attribute_that_forced_it_and_comes_first() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/opentofu_show-json_requires-replace.json"))
    text = render_text(build_preview(plan))
    assert "test_instance.test  replace (destroy, then create): `ami` forces replacement" in text
    assert text.index("DESTROYS AND REPLACEMENTS") < text.index("CHANGES")


def test_tainted_replacement_gives_its_reason() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/terraform-json_action_reason.plan.json"))
    assert plan.resource_changes[0].action_reason == "replace_because_tainted"
    assert "the object is tainted" in render_text(build_preview(plan))


def test_unknown_values_show_as_known_after_apply() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/tf-plan-format_update.tfplan.json"))
    assert 'output: "foo" -> (known after apply)' in render_text(build_preview(plan))


def test_drift_from_real_plan_is_shown_and_named() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/tf-summarize_example.tfplan.json"))
    preview = build_preview(plan)
    assert len(preview.drift) == 3
    text = render_text(preview)
    assert "DRIFT (changed outside the gateway)" in text
    assert 'module.github["terraform-plan-summary"].github_repository.repository: deleted outside the gateway' in text


def test_indexed_module_addresses_keep_their_keys() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/tf-summarize_example.tfplan.json"))
    assert any(rc.module_address == 'module.github["demo-repository"]' for rc in plan.resource_changes)


def test_markdown_puts_each_resource_in_a_collapsible_diff() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/checkov_plan_change_keys.tfplan.json"))
    md = render_markdown(build_preview(plan))
    assert "<details><summary><code>~ aws_security_group_rule.foo</code>" in md
    assert "! to_port: 5432 -> 5433" in md


def test_json_preview_is_machine_readable() -> None:
    plan = load_plan(load_fixture(FIXTURES / "tfplan/opentofu_show-json_requires-replace.json"))
    data = json.loads(RENDERERS["json"](build_preview(plan)))
    assert data["counts"] == {"replace": 1}
    assert data["danger"][0]["reason"] == "`ami` forces replacement"


def test_only_no_ops_says_no_changes_in_one_line() -> None:
    document = load_fixture(FIXTURES / "tfplan/tf-plan-format_update.tfplan.json")
    document["resource_changes"][0]["change"]["actions"] = ["no-op"]
    document["output_changes"] = {}
    for fmt in ("text", "markdown"):
        output = RENDERERS[fmt](build_preview(load_plan(document)))
        assert output.strip().strip("*") == NO_CHANGES
        assert output.count("\n") == 1


@pytest.mark.parametrize("version", ["2.0", "10.1"])
def test_unknown_major_format_version_is_refused_by_name(version: str) -> None:
    with pytest.raises(PlanFormatError, match=f"format_version {version} is not supported"):
        load_plan({"format_version": version, "resource_changes": []})


@pytest.mark.parametrize("content,message", [
    (b"not json", "not valid JSON"),
    (b'{"resource_changes": []}', "no format_version"),
    (b'[1, 2]', "must be a JSON object"),
    (b'{"format_version": "1.2", "resource_changes": [{"address": "a.b"}]}', "malformed change"),
    (b'{"format_version": "1.2", "resource_changes": [{"address": "a.b", "type": "a", "name": "b", '
     b'"change": {"actions": ["explode"]}}]}', "unknown action list"),
])
def test_malformed_plans_get_a_precise_error(content: bytes, message: str) -> None:
    with pytest.raises(PlanFormatError, match=message):
        load_plan(decode_plan_bytes(content))


def test_utf16_plan_files_written_on_windows_load() -> None:
    raw = (FIXTURES / "tfplan/tf-plan-format_update.tfplan.json").read_text()
    plan = load_plan(decode_plan_bytes(codecs.BOM_UTF16_LE + raw.encode("utf-16-le")))
    assert plan.resource_changes[0].kind == ChangeKind.UPDATE


def test_all_action_lists_are_classified() -> None:
    kinds = {}
    for actions in (["no-op"], ["create"], ["read"], ["update"], ["delete"], ["delete", "create"],
                    ["create", "delete"], ["forget"], ["create", "forget"]):
        document = {"format_version": "1.2", "resource_changes": [
            {"address": "x.y", "type": "x", "name": "y", "change": {"actions": actions}}]}
        kinds[tuple(actions)] = load_plan(document).resource_changes[0].kind
    assert kinds[("create", "delete")] == ChangeKind.REPLACE_CREATE_FIRST
    assert kinds[("delete", "create")] == ChangeKind.REPLACE
    assert len(set(kinds.values())) == 9


def test_a_resource_that_only_moved_or_is_imported_is_listed_and_counted_in_every_format() -> None:
    moved = {"address": "aws_s3_bucket.new", "previous_address": "aws_s3_bucket.old", "mode": "managed",
             "type": "aws_s3_bucket", "name": "new",
             "change": {"actions": ["no-op"], "before": {"bucket": "b"}, "after": {"bucket": "b"}, "after_unknown": {}}}
    imported = {**moved, "address": "aws_s3_bucket.imp", "name": "imp", "previous_address": None,
                "change": {**moved["change"], "importing": {"id": "imp-1"}}}
    preview = build_preview(load_plan({"format_version": "1.2", "terraform_version": "1.9.0",
                                       "resource_changes": [moved, imported]}))
    assert preview.has_changes
    text, markdown, document = (RENDERERS[f](preview) for f in ("text", "markdown", "json"))
    for rendered in (text, markdown):
        assert "1 to import" in rendered and "1 moved" in rendered
        assert "aws_s3_bucket.new" in rendered and "moved from aws_s3_bucket.old" in rendered
        assert "importing id imp-1" in rendered
    data = json.loads(document)
    assert data["counts"] == {"moved": 1, "import": 1}
    assert [c["label"] for c in data["changes"]] == ["moved, nothing else changes", "imported, nothing else changes"]


def test_the_module_versions_a_plan_was_made_with_are_shown_without_credentials() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    document = {"format_version": "1.2", "terraform_version": "1.9.0", "resource_changes": [], "gateway_modules": [
        {"key": "vpc", "source": "registry.terraform.io/terraform-aws-modules/vpc/aws", "version": "5.1.2",
         "digest": "sha256:aa"},
        {"key": "net", "source": "git::https://deploy:tok-s3cr3t@git.example.com/net.git?ref=v1&sshkey=tok-s3cr3t",
         "version": commit, "digest": "sha256:bb"},
        {"key": "zip", "source": "https://files.example.com/m.zip?token=tok-s3cr3t", "version": "",
         "digest": "sha256:0123456789abcdef99"}]}
    preview = build_preview(load_plan(document))
    text, markdown, data = (RENDERERS[f](preview) for f in ("text", "markdown", "json"))
    line = ("Modules: net git::https://git.example.com/net.git?ref=v1 @0123456789ab; "
            "vpc registry.terraform.io/terraform-aws-modules/vpc/aws 5.1.2; zip https://files.example.com/m.zip "
            "sha256:0123456789ab")
    assert line in text.splitlines()
    assert "`vpc registry.terraform.io/terraform-aws-modules/vpc/aws 5.1.2`" in markdown
    assert "tok-s3cr3t" not in text + markdown + data
    assert preview_from_json(data) == preview  # stored previews keep them
    assert "Modules:" not in render_text(build_preview(load_plan({**document, "gateway_modules": []})))
