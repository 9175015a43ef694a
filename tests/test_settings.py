"""The settings come from the environment as they always have: every `GATEWAY_*` variable (any case), OPENAI_* without
the prefix, keywords over the environment, unknown variables ignored, a bad value refused naming its setting, and
no secret shown in a repr or an error."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from gateway.config import ChannelSecret, Settings
from gateway.domain.errors import ConfigError
from tests.conftest import run_cli


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("GATEWAY_", "OPENAI_")):
            monkeypatch.delenv(name)


def variable(name: str) -> str:
    alias = Settings.model_fields[name].validation_alias
    return alias if isinstance(alias, str) else f"GATEWAY_{name.upper()}"


def sample(name: str) -> tuple[str, Any]:
    """A valid value for setting NAME that is not its default: as the environment spells it, and as it is read."""
    field = Settings.model_fields[name]
    kinds = set(typing.get_args(field.annotation)) - {type(None)} or {field.annotation}
    default = field.default
    if typing.get_origin(field.annotation) is dict:  # a table, spelled as JSON
        return json.dumps({"ops": {"url": "https://hooks.example.com/x", "key": "k1"}}), {
            "ops": ChannelSecret(url=SecretStr("https://hooks.example.com/x"), key=SecretStr("k1"))}
    if list[str] in kinds:  # a list, spelled as JSON
        return json.dumps(["acme/*", "other/infra"]), ["acme/*", "other/infra"]
    if SecretStr in kinds:
        return f"secret-{name}", f"secret-{name}"
    if Path in kinds:
        return f"/srv/{name}", Path(f"/srv/{name}")
    if bool in kinds:
        return ("false", False) if default else ("true", True)
    if int in kinds:
        number = default + 1 if default is not None else 12345
        return str(number), number
    if float in kinds:
        number = default * 2 if default else 2.5
        return str(number), number
    if name == "github_git_url":  # a template: where each repository is cloned
        return "https://git.example.com/{repository}.git", "https://git.example.com/{repository}.git"
    if str in kinds and name.endswith("_url") and default and str(default).startswith("http"):
        return f"https://{name.replace('_', '-')}.example.com", f"https://{name.replace('_', '-')}.example.com"
    if str in kinds:
        return f"value-{name}", f"value-{name}"
    raise AssertionError(f"{name}: no sample for {field.annotation}")


def plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return {k: plain(v) for k, v in value}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_read_from_its_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spelled, expected = sample(name)
    monkeypatch.setenv(variable(name), spelled)
    assert plain(getattr(Settings(), name)) == plain(expected)
    assert getattr(Settings(), name) != Settings.model_fields[name].default


def test_a_git_url_template_names_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_GITHUB_GIT_URL", "https://git.example.com/infra.git")
    with pytest.raises(ConfigError, match="must hold {repository}"):
        Settings()


def test_names_are_read_in_any_case_and_openai_has_no_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("gateway_model", "small-model")
    monkeypatch.setenv("Gateway_Lock_Wait_Seconds", "4")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("GATEWAY_OPENAI_API_KEY", "not-this-one")
    settings = Settings()
    assert (settings.model, settings.lock_wait_seconds, settings.openai_base_url) == ("small-model", 4.0,
                                                                                      "http://127.0.0.1:9/v1")
    assert settings.openai_api_key is None


def test_keywords_win_over_the_environment_which_fills_in_the_rest(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_HOME", "/elsewhere")
    monkeypatch.setenv("GATEWAY_SMTP_PORT", "2525")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://from-env/v1")
    monkeypatch.setenv("GATEWAY_NOTIFICATION_CHANNELS", '{"env-hook": {"url": "https://env"}}')
    settings = Settings(home=tmp_path, openai_base_url="http://given/v1", notification_channels={"given": {"key": "k"}})
    assert (settings.home, settings.smtp_port, settings.openai_base_url) == (tmp_path, 2525, "http://given/v1")
    assert sorted(settings.notification_channels) == ["env-hook", "given"]  # channel tables are merged, key by key
    assert Settings().home == Path("/elsewhere")
    monkeypatch.setenv("GATEWAY_TOKEN", "gw_from_env")
    assert Settings(token=None).token is None  # as the demo and the evals make theirs: None given is None
    assert Settings.model_validate({}).token is not None  # validating reads the environment too, as it did


def test_defaults_unknown_variables_and_empty_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "debug")  # read by gateway.logs, not a setting
    monkeypatch.setenv("GATEWAY_NO_SUCH_SETTING", "1")
    monkeypatch.setenv("GATEWAY_DATABASE_URL", "")
    monkeypatch.setenv("GATEWAY_TOKEN", "")
    settings = Settings()
    assert settings.db_url == f"sqlite:///{Path('.gateway').resolve() / 'gateway.db'}"
    assert settings.token is not None and not settings.token  # set but empty: no token to authenticate with
    assert isinstance(settings.agent_turn_hold_seconds, float) and settings.agent_turn_hold_seconds == 600.0


def test_a_bad_value_is_refused_naming_each_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SMTP_PORT", "0")
    monkeypatch.setenv("GATEWAY_NOTIFY_ATTEMPTS", "several")
    with pytest.raises(ConfigError) as refused:
        Settings()
    assert str(refused.value) == ("invalid settings: GATEWAY_SMTP_PORT (the setting smtp_port): Input should be "
                                  "greater than or equal to 1; GATEWAY_NOTIFY_ATTEMPTS (the setting notify_attempts): "
                                  "Input should be a valid integer, unable to parse string as an integer")
    with pytest.raises(ConfigError, match="web_session_hours"):
        Settings(web_session_hours=0)


def test_a_misspelt_channel_key_is_named_and_its_value_never_shown(tmp_path: Path) -> None:
    done = run_cli(["show", "1"], tmp_path / "home",
                   GATEWAY_NOTIFICATION_CHANNELS='{"ops": {"ulr": "https://hooks.slack.com/s3cret-url"}}')
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "GATEWAY_NOTIFICATION_CHANNELS (the setting notification_channels) at ops.ulr" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout


def test_secrets_are_not_shown_when_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TOKEN", "gw_tok_s3cret")
    monkeypatch.setenv("GATEWAY_NOTIFICATION_CHANNELS", '{"hook": {"url": "https://hooks/s3cret-url"}}')
    shown = f"{Settings()!r} {Settings()}"
    assert "s3cret" not in shown and "hook" in shown


def test_channels_that_are_not_json_stop_the_command_naming_the_variable(tmp_path: Path) -> None:
    done = run_cli(["show", "1"], tmp_path / "home", GATEWAY_NOTIFICATION_CHANNELS='{"hook": {"url": "s3cret-url"')
    assert done.returncode != 0
    assert "notification_channels" in done.stderr.lower() and "s3cret" not in done.stderr


def test_a_public_url_that_is_not_one_is_refused_at_start_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # compose's `${GATEWAY_PUBLIC_URL:-...}` left uninterpolated once crashed the API at start with a traceback
    monkeypatch.setenv("GATEWAY_PUBLIC_URL", "${GATEWAY_PUBLIC_URL:-https://localhost:8443}")
    with pytest.raises(ConfigError, match=r"GATEWAY_PUBLIC_URL \(the setting public_url\).*http:// or https://"):
        Settings()
    monkeypatch.setenv("GATEWAY_PUBLIC_URL", "https://gateway.example.com/")
    assert Settings().public_url == "https://gateway.example.com"


def test_github_repositories_are_owner_name_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_GITHUB_REPOSITORIES", '["acme/*", "infra"]')
    with pytest.raises(ConfigError, match=r"GATEWAY_GITHUB_REPOSITORIES .*'infra' is not an owner/name pattern"):
        Settings()
    monkeypatch.setenv("GATEWAY_GITHUB_REPOSITORIES", '["acme/*"]')
    assert Settings().github_repositories == ["acme/*"]
