"""Node settings from the environment (pure logic)."""

from __future__ import annotations

import pytest

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
    monkeypatch.setenv("CANCEL_BUS_SELF_FENCE_AFTER", "5")
    with pytest.raises(ValueError, match="self_fence_after must be at least lease_ttl"):
        Settings()
    monkeypatch.setenv("CANCEL_BUS_SELF_FENCE_AFTER", "30")
    assert Settings().self_fence_after == 30
