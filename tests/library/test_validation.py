"""Bad input is rejected with a clear, typed error before anything touches Redis (behaviour 13)."""

from __future__ import annotations

import pytest

from cancel_bus import CancelBus, InvalidArgument, InvalidId
from cancel_bus._keys import MAX_ID_LENGTH, KeySpace, validate_id

from ..conftest import BusFactory
from ..helpers import redis_of

BAD_IDS = [
    "",
    "has space",
    "star*",
    "question?",
    "[bracket]",
    "{brace}",
    "co:lon",
    "slash/",
    "new\nline",
    "x" * (MAX_ID_LENGTH + 1),
    "ünïcode",
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_unsafe_ids_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidId) as caught:
        validate_id(bad, "run_id")
    assert "run_id" in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("good", ["run-1", "a.b_c@d+e=f", "x" * MAX_ID_LENGTH, "0"])
def test_safe_ids_are_accepted(good: str) -> None:
    assert validate_id(good, "run_id") == good


def test_non_string_id_is_rejected() -> None:
    with pytest.raises(InvalidId):
        validate_id(12, "run_id")


@pytest.mark.parametrize("bad", ["", "a b", "{x}", "a:b", "*"])
def test_bad_namespace_is_rejected(bad: str) -> None:
    with pytest.raises(InvalidId):
        KeySpace(bad)
    with pytest.raises(InvalidId):
        CancelBus("redis://127.0.0.1:1/0", namespace=bad)


def test_keys_share_one_hash_tag() -> None:
    keys = KeySpace("tenant-a")
    names = [
        keys.active,
        keys.finished,
        keys.nodes,
        keys.run("r"),
        keys.events("r"),
        keys.relay("r"),
        keys.waiters("r"),
        keys.session("a", "u", "s"),
        keys.node("n"),
        keys.node_runs("n"),
        keys.node_pending("n"),
        keys.channel("n"),
    ]
    assert all(name.startswith("cb:{tenant-a}:") for name in names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "options",
    [
        {"lease_ttl": 0},
        {"lease_ttl": float("nan")},
        {"retention": 0},
        {"retention": float("inf")},
        {"retention": 1e20},  # Redis could not expire it
        {"sweep_interval": 0},
        {"node_id": "a b"},
        {"max_output_chars": -1},
    ],
)
def test_bad_bus_options_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        CancelBus("redis://127.0.0.1:1/0", **options)  # type: ignore[arg-type]


def test_the_settings_are_checked_before_the_keys() -> None:
    with pytest.raises(InvalidArgument, match=r"lease_ttl must be 0\.3 to 3600 seconds"):
        CancelBus("redis://127.0.0.1:1/0", lease_ttl=0.1, signing_key="")


async def test_bad_arguments_on_a_live_bus_leave_redis_untouched(
    make_bus: BusFactory, raw_redis: object
) -> None:
    bus = await make_bus()
    before = await redis_of(bus).dbsize()
    calls = [
        bus.cancel("bad id"),
        bus.cancel("r", mode="sometimes"),
        bus.cancel("r", timeout=0),
        bus.cancel("r", timeout=-1),
        bus.cancel("r", reason="x" * 5000),
        bus.cancel_session("a", "u", "s*"),
        bus.get_run("{x}"),
        bus.events("a:b"),
        bus.list_runs(status="weird"),
        bus.list_runs(limit=0),
        bus.list_runs(limit=100_000),
        bus.list_runs(user_id="u u"),
        bus.enqueue(app_name="a", user_id="u"),  # a partial session key
        bus.enqueue(metadata={"x": object()}),
        bus.enqueue(metadata={"x": "y" * 20000}),
        bus.wait("r", timeout=0),
        *(call(None) for call in (bus.cancel, bus.get_run, bus.events, bus.children)),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidArgument):
            await call
    for scope_options in (
        {"run_id": "a b"},
        {"app_name": "a", "user_id": "u"},
        {"metadata": "not a dict"},
        {"multitask_strategy": "interrupt"},  # with no session key
        {"app_name": "a", "user_id": "u", "session_id": "s", "multitask_strategy": "later"},
        {"app_name": "a", "user_id": "u", "session_id": "s", "interrupt_timeout": 0},
    ):
        with pytest.raises(InvalidArgument):
            bus.run(**scope_options)  # type: ignore[arg-type]
    assert await redis_of(bus).dbsize() == before


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1",
        "redis+foo://h:1",
        "redis+sentinel://h:1",
        "redis+cluster://h",
        "redis+sentinel://:1/m/0",
        "redis+cluster://h:x",
        "redis+sentinel://h:1/m/x",  # the database
        "redis://h:notaport/0",
        "redis://h:99999/0",
        "redis://h:1/0?bogus_option=1",  # redis-py would fail at the first connection
        "redis://h:1/0?socket_timeout=abc",
        "redis://h:1/0?ssl_cert_reqs=maybe",
        "redis://h:1/0?sentinel_password=x",
    ],
)
def test_bad_redis_urls_are_rejected_clearly(url: str) -> None:
    with pytest.raises(InvalidArgument, match=r"Redis URL|URL option|sentinel|a host:port"):
        CancelBus(url, namespace="n")


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:Secr3t#x@h:1/0",  # a reserved character left in the password
        "redis://u:Secr3t/x@h:1/0",
        "redis://u:Secr3t@h:notaport/0",
    ],
)
def test_a_bad_redis_url_never_shows_its_password(url: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        CancelBus(url, namespace="n")
    message = str(caught.value)
    assert "Secr3t" not in message and "***@h:" in message, message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
