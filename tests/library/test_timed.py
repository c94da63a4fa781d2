"""TimedMap (pure logic): entries expire by age, the oldest goes first beyond the size bound."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from cancel_bus import _timed
from cancel_bus._timed import TimedMap


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_timed, "time", SimpleNamespace(monotonic=fake, time=time.time))
    return fake


def test_entries_expire_by_age_and_renew_when_put_again(clock: FakeClock) -> None:
    remembered: TimedMap[str, int] = TimedMap(ttl=10, max_items=100)
    remembered.put("a", 1)
    remembered.put("b", 2)
    clock.now += 6
    remembered.put("a", 3)  # renewed
    clock.now += 6  # b is 12 s old, a 6 s
    assert remembered.get("a") == 3 and "b" not in remembered
    assert list(remembered) == ["a"] and len(remembered) == 1
    clock.now += 10
    assert remembered.get("a") is None and len(remembered) == 0


def test_the_oldest_entry_goes_first_beyond_the_bound(clock: FakeClock) -> None:
    remembered: TimedMap[str, int] = TimedMap(ttl=10, max_items=2)
    for i, key in enumerate("abc"):
        remembered.put(key, i)
        clock.now += 1
    assert list(remembered) == ["b", "c"]
    assert remembered.pop("b") == 1 and remembered.pop("b") is None
    assert list(remembered) == ["c"]
