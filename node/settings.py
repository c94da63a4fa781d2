"""Node configuration from the environment (prefix ``CANCEL_BUS_``); fails loudly with the key."""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from cancel_bus import MAX_RETENTION
from cancel_bus.fields import Id, Label, OptionalId

ENV_PREFIX = "CANCEL_BUS_"
CLIENT_VARIABLES = frozenset({f"{ENV_PREFIX}URL", f"{ENV_PREFIX}TOKEN"})  # the CLI's, not a node's


class TokenGrant(BaseModel):
    """What one API token may do: ``ops`` sees and cancels everything, ``user`` its own runs."""

    role: Literal["ops", "user"]
    user_id: OptionalId = None
    name: Label | None = None

    @model_validator(mode="after")
    def _user_needs_an_id(self) -> TokenGrant:
        if self.role == "user" and self.user_id is None:
            raise ValueError("a token with role 'user' needs a user_id")
        return self


class Settings(BaseSettings):
    """The node's settings, read from the ``CANCEL_BUS_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    redis_url: str | None = Field(
        default=None, description="Redis URL; empty starts an embedded server"
    )
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_sentinel_username: str | None = None
    redis_sentinel_password: SecretStr | None = None
    namespace: Id = "cancel-bus"
    app_namespaces: dict[Id, Id] = Field(
        default_factory=dict,
        description='JSON {"<app_name>": "<namespace>"}: apps served in their own namespace',
    )
    node_id: OptionalId = None
    lease_ttl: float = Field(default=10.0, ge=0.3, le=3600, allow_inf_nan=False)
    retention: float = Field(default=86400.0, ge=1, le=MAX_RETENTION, allow_inf_nan=False)
    drain_timeout: float = Field(default=20.0, ge=0, le=3600, allow_inf_nan=False)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_tokens: SecretStr | None = Field(
        default=None, description='JSON: {"<token>": {"role": "ops"|"user", "user_id": ...}}'
    )
    api_tokens_file: Path | None = None
    metrics_require_token: bool | None = Field(
        default=None, description="/metrics needs an ops token; default: when tokens are set"
    )
    insecure_no_auth: bool = Field(
        default=False, description="allow auth off (no tokens) on a non-loopback address"
    )
    signing_key: SecretStr | None = None
    verification_keys: SecretStr | None = Field(
        default=None,
        description="JSON list of keys accepted besides the signing key (key rotation)",
    )
    self_fence_after: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="seconds after its last renewal at which a node Redis does not renew stops "
        "its runs; at most (and by default) the lease less a margin",
    )
    accept_eviction: bool = Field(
        default=False,
        description="start on a Redis whose maxmemory-policy may evict keys (it would drop live "
        "runs; refused otherwise); /readyz names the risk",
    )
    profile_checkpoints: bool = Field(
        default=False,
        description="record per run where it went longest without a checkpoint (a little cost "
        "on every checkpoint)",
    )
    data_dir: Path | None = None
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    sse_send_timeout: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        allow_inf_nan=False,
        description="seconds a stream's client may take nothing before it is dropped",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = Field(default=True, description="log every HTTP request (uvicorn's)")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        """A relative data dir is the current directory's (the server changes its own)."""
        return None if value is None else value.expanduser().absolute()

    def check_environment(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """Refuse (ValueError) a ``CANCEL_BUS_*`` variable that looks like a misspelt setting —
        the node would start without it, e.g. an embedded server in place of the cluster's
        Redis — and Redis credentials without a Redis URL; -> the other unknown names."""
        names = {name.upper() for name in (os.environ if environ is None else environ)}
        known = {ENV_PREFIX + field.upper() for field in type(self).model_fields}
        unknown = sorted(n for n in names if n.startswith(ENV_PREFIX) and n not in known)
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close and name not in CLIENT_VARIABLES:
                raise ValueError(f"unknown setting {name}: did you mean {close[0]}?")
        credentials = (
            "redis_username", "redis_password", "redis_sentinel_username", "redis_sentinel_password"
        )  # fmt: skip
        given = [field for field in credentials if getattr(self, field)]
        if self.redis_url is None and given:
            raise ValueError(
                f"{ENV_PREFIX}{given[0].upper()} is set but {ENV_PREFIX}REDIS_URL is not (without "
                "a URL the node starts an embedded server of its own)"
            )
        return [name for name in unknown if name not in CLIENT_VARIABLES]

    @field_validator(
        "redis_url",
        "redis_username",
        "redis_password",
        "api_tokens",
        "api_tokens_file",
        "signing_key",
        "verification_keys",
        "self_fence_after",
        "data_dir",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def tokens(self) -> dict[str, TokenGrant]:
        """The configured tokens (from the variable and/or the file); empty: auth is off."""
        raw: dict[str, object] = {}
        if self.api_tokens_file is not None:
            raw.update(_load_json(self.api_tokens_file.read_text(), "API_TOKENS_FILE"))
        if self.api_tokens is not None:
            raw.update(_load_json(self.api_tokens.get_secret_value(), "API_TOKENS"))
        tokens = {}
        for token, grant in raw.items():
            if len(token) < 16:
                raise ValueError(f"{ENV_PREFIX}API_TOKENS: every token needs 16+ characters")
            try:
                tokens[token] = TokenGrant.model_validate(grant)
            except ValidationError as exc:  # one line, and not the token
                problems = "; ".join(e["msg"] for e in exc.errors())
                raise ValueError(f"{ENV_PREFIX}API_TOKENS: a bad grant: {problems}") from None
        return tokens

    def accepted_keys(self) -> list[str]:
        """The keys bus messages may be sealed with besides the signing key."""
        if self.verification_keys is None:
            return []
        keys = _parse_json(self.verification_keys.get_secret_value(), "VERIFICATION_KEYS")
        if not isinstance(keys, list) or not all(isinstance(key, str) and key for key in keys):
            raise ValueError(f"{ENV_PREFIX}VERIFICATION_KEYS must be a JSON list of strings")
        if self.signing_key is None:
            raise ValueError(f"{ENV_PREFIX}VERIFICATION_KEYS needs {ENV_PREFIX}SIGNING_KEY")
        return keys

    def redis_connection_url(self) -> str | None:
        """``redis_url`` with the credentials of their own variables put in, URL-encoded, so a
        secret can hold any character: ``redis_username``/``redis_password`` as the URL's user
        and the sentinels' as its ``sentinel_username``/``sentinel_password`` parameters."""
        credentials = (
            self.redis_username,
            self.redis_password,
            self.redis_sentinel_username,
            self.redis_sentinel_password,
        )
        if self.redis_url is None or all(value is None for value in credentials):
            return self.redis_url
        parts = urlsplit(self.redis_url)
        netloc = parts.netloc
        if self.redis_username is not None or self.redis_password is not None:
            user = quote(self.redis_username or unquote(parts.username or ""), safe="")
            password = _secret(self.redis_password)
            userinfo = user + (":" + quote(password, safe="") if password else "")
            netloc = f"{userinfo}@{netloc.rpartition('@')[2]}"
        query = parse_qsl(parts.query)
        for name, value in (
            ("sentinel_username", self.redis_sentinel_username),
            ("sentinel_password", _secret(self.redis_sentinel_password)),
        ):
            if value:
                query = [(k, v) for k, v in query if k != name] + [(name, value)]
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    @property
    def auth_enabled(self) -> bool:
        """Tokens are configured (an empty table is auth off)."""
        return bool(self.tokens())

    def check_exposure(self) -> None:
        """Auth off is for loopback only, unless ``insecure_no_auth`` says otherwise."""
        if self.auth_enabled or self.insecure_no_auth or is_loopback(self.host):
            return
        raise ValueError(
            f"auth is off (no {ENV_PREFIX}API_TOKENS) and {ENV_PREFIX}HOST={self.host} is not "
            "a loopback address: give API tokens, listen on 127.0.0.1, or set "
            f"{ENV_PREFIX}INSECURE_NO_AUTH=true (serve --insecure-no-auth) to let anyone who "
            "reaches it see and cancel every run"
        )

    def state_dir(self) -> Path:
        """Where the node keeps its state: ``data_dir``, else ``$XDG_STATE_HOME/cancel-bus`` (by
        default ``~/.local/state/cancel-bus``)."""
        if self.data_dir is not None:
            return self.data_dir
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "cancel-bus"


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address (127.0.0.0/8, ::1); any other name may resolve
    elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def _parse_json(text: str, key: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_PREFIX}{key} is not valid JSON: {exc.msg}") from None


def _load_json(text: str, key: str) -> dict[str, object]:
    value = _parse_json(text, key)
    if not isinstance(value, dict):
        raise ValueError(f"{ENV_PREFIX}{key} must be a JSON object of token -> grant")
    return value
