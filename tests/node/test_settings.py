"""Node settings from the environment (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from node.settings import Settings


def test_redis_credentials_from_their_own_variables_are_url_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CANCEL_BUS_REDIS_URL", "redis+sentinel://old:pw@s1:26379,s2:26379/m/0")
    monkeypatch.setenv("CANCEL_BUS_REDIS_USERNAME", "app")
    monkeypatch.setenv("CANCEL_BUS_REDIS_PASSWORD", "p@ss:w/rd%")
    url = Settings().redis_connection_url()
    assert url == "redis+sentinel://app:p%40ss%3Aw%2Frd%25@s1:26379,s2:26379/m/0"


def test_without_separate_credentials_the_url_is_used_as_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CANCEL_BUS_REDIS_URL", "rediss://u:p@host:6380/2?ssl_ca_certs=/ca.pem")
    monkeypatch.delenv("CANCEL_BUS_REDIS_USERNAME", raising=False)
    monkeypatch.delenv("CANCEL_BUS_REDIS_PASSWORD", raising=False)
    assert Settings().redis_connection_url() == "rediss://u:p@host:6380/2?ssl_ca_certs=/ca.pem"


def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANCEL_BUS_LEASE_TTL", "0")
    with pytest.raises(ValueError, match="lease_ttl"):
        Settings()
    monkeypatch.setenv("CANCEL_BUS_LEASE_TTL", "10")
    monkeypatch.setenv("CANCEL_BUS_API_TOKENS", '{"short": {"role": "ops"}}')
    with pytest.raises(ValueError, match="16"):
        Settings().tokens()


def test_sentinel_credentials_become_url_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANCEL_BUS_REDIS_URL", "rediss+sentinel://s1:26379/m/0?ssl_ca_certs=/ca")
    monkeypatch.setenv("CANCEL_BUS_REDIS_SENTINEL_USERNAME", "sentinel-user")
    monkeypatch.setenv("CANCEL_BUS_REDIS_SENTINEL_PASSWORD", "s&cret=1")
    url = Settings().redis_connection_url()
    assert url == (
        "rediss+sentinel://s1:26379/m/0?ssl_ca_certs=%2Fca&sentinel_username=sentinel-user"
        "&sentinel_password=s%26cret%3D1"
    )


def test_verification_keys_and_the_self_fence_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANCEL_BUS_VERIFICATION_KEYS", '["old-key"]')
    with pytest.raises(ValueError, match="needs CANCEL_BUS_SIGNING_KEY"):
        Settings().accepted_keys()
    monkeypatch.setenv("CANCEL_BUS_SIGNING_KEY", "new-key")
    assert Settings().accepted_keys() == ["old-key"]
    for bad in ('"old-key"', "[1]", '[""]', "[old-key]"):
        monkeypatch.setenv("CANCEL_BUS_VERIFICATION_KEYS", bad)
        with pytest.raises(ValueError, match="VERIFICATION_KEYS"):
            Settings().accepted_keys()
    monkeypatch.setenv("CANCEL_BUS_LEASE_TTL", "10")
    monkeypatch.setenv("CANCEL_BUS_SELF_FENCE_AFTER", "5")  # sooner than the lease's own fence
    assert Settings().self_fence_after == 5
    monkeypatch.setenv("CANCEL_BUS_SELF_FENCE_AFTER", "0")
    with pytest.raises(ValueError, match="greater than 0"):
        Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RETENTION", "inf"),
        ("RETENTION", "1e20"),  # Redis could not expire it: the run's final write would fail
        ("LEASE_TTL", "nan"),
        ("DRAIN_TIMEOUT", "nan"),
        ("SELF_FENCE_AFTER", "inf"),
    ],
)
def test_numbers_are_finite_and_bounded(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"CANCEL_BUS_{name}", value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert [error["loc"] for error in caught.value.errors()] == [(name.lower(),)]


def test_the_self_fence_error_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANCEL_BUS_LEASE_TTL", "5")
    monkeypatch.setenv("CANCEL_BUS_SELF_FENCE_AFTER", "-2")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert [error["loc"] for error in caught.value.errors()] == [("self_fence_after",)]


def test_a_relative_data_dir_is_the_current_directorys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CANCEL_BUS_DATA_DIR", "state")
    assert Settings().state_dir() == tmp_path / "state"
    monkeypatch.setenv("CANCEL_BUS_DATA_DIR", "")
    assert Settings().data_dir is None  # empty: the default place, not the current directory


def test_a_misspelt_setting_is_refused_and_other_names_are_reported() -> None:
    settings = Settings()
    with pytest.raises(ValueError, match="CANCEL_BUS_REDIS_ULR: did you mean CANCEL_BUS_REDIS_URL"):
        settings.check_environment({"CANCEL_BUS_REDIS_ULR": "redis://h:1/0"})
    with pytest.raises(ValueError, match="did you mean CANCEL_BUS_LEASE_TTL"):
        settings.check_environment({"cancel_bus_lease_tl": "5"})  # names are case-insensitive
    others = {"CANCEL_BUS_URL": "", "CANCEL_BUS_TOKEN": "", "CANCEL_BUS_MODEL_CASES": "9"}
    assert settings.check_environment({**others, "PATH": "/bin"}) == ["CANCEL_BUS_MODEL_CASES"]


def test_redis_credentials_without_a_url_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CANCEL_BUS_REDIS_URL", raising=False)
    monkeypatch.setenv("CANCEL_BUS_REDIS_PASSWORD", "secret")
    with pytest.raises(ValueError, match="REDIS_PASSWORD is set but CANCEL_BUS_REDIS_URL is not"):
        Settings().check_environment({})
