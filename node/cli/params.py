"""What the command line's values are: numbers within the node's own bounds, durations, times,
URLs, metadata items, ids. A value that is none of these is a bad command line (exit code 2),
in the words of :func:`parse` functions' ValueErrors."""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable
from datetime import datetime
from datetime import time as dt_time
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias
from urllib.parse import urlsplit

import click
from pydantic import BaseModel

DEFAULT_URL = "http://127.0.0.1:8080"

if TYPE_CHECKING:  # generic from click 8.4; a plain class before (the [node] extra allows 8.1)
    _ParamType: TypeAlias = click.ParamType[Any]
else:
    _ParamType = click.ParamType


class Parsed(_ParamType):
    """A value ``parse`` reads from the command line; its ValueError says what is wrong."""

    def __init__(self, parse: Callable[[str], Any], name: str = "text") -> None:
        self.parse, self.name = parse, name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """click's conversion: ``parse`` a string (its ValueError is a bad command line naming the
        option); any other value as it is."""
        if not isinstance(value, str):
            return value  # a default, or an option's value when given without one
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def number(kind: type[int] | type[float]) -> Callable[[str], float]:
    """A finite number of this kind (``nan``, ``inf`` and ``1e400`` are none)."""
    what = "a whole number" if kind is int else "a number"

    def parse(value: str) -> float:
        try:
            parsed = kind(value)
        except ValueError:
            raise ValueError(f"{value!r} is not {what}") from None
        if not math.isfinite(parsed):
            raise ValueError(f"{value!r} is not {what}")
        return parsed

    return parse


def seconds(value: str) -> float:
    """``90``, ``90s``, ``5m``, ``2h``, ``1d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    amount, unit = (value[:-1], value[-1]) if value[-1:] in units else (value, "s")
    try:
        parsed = float(amount) * units[unit]
    except ValueError:
        parsed = math.nan
    if not 0 <= parsed < math.inf:
        raise ValueError(f"{value!r} is not a duration (90s, 5m, 2h)")
    return parsed


def duration(value: float) -> str:
    """``7d``, ``5m``, ``90s``: as :func:`seconds` reads them."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


def plain(value: float) -> str:
    """A number as ``%g`` writes it: ``0.1``, ``60``."""
    return f"{value:g}"


class Within(Parsed):
    """A number ``parse`` reads, within ``limits`` (pydantic's names: gt, ge, lt, le). Built
    from the node's own model of a field (:meth:`of`), it refuses as a bad command line what
    the node would refuse (HTTP 422)."""

    CHECKS: ClassVar[dict[str, tuple[Callable[[float, float], bool], str]]] = {
        "gt": (operator.gt, "above"),
        "ge": (operator.ge, "at least"),
        "lt": (operator.lt, "below"),
        "le": (operator.le, "at most"),
    }

    def __init__(
        self,
        parse: Callable[[str], float],
        limits: dict[str, float],
        show: Callable[[float], str] = plain,
    ) -> None:
        super().__init__(self._checked, "number")
        self.read, self.limits, self.show = parse, limits, show

    @classmethod
    def of(
        cls,
        model: type[BaseModel],
        field: str,
        parse: Callable[[str], float],
        show: Callable[[float], str] = plain,
    ) -> Within:
        """The bounds the node's ``model`` puts on ``field`` (gt, ge, lt, le), on a number read with
        ``parse``."""
        limits = {
            name: getattr(constraint, name)
            for constraint in model.model_fields[field].metadata
            for name in cls.CHECKS
            if getattr(constraint, name, None) is not None
        }
        return cls(parse, limits, show)

    def _checked(self, value: str) -> float:
        parsed = self.read(value)  # finite, or a ValueError
        if not all(self.CHECKS[name][0](parsed, bound) for name, bound in self.limits.items()):
            raise ValueError(f"{value!r} is out of range ({self})")
        return parsed

    def __str__(self) -> str:
        """``0.1-60``, or ``above 0s, at most 7d``."""
        if self.limits.keys() == {"ge", "le"}:
            return f"{self.show(self.limits['ge'])}-{self.show(self.limits['le'])}"
        return ", ".join(
            f"{self.CHECKS[name][1]} {self.show(bound)}" for name, bound in self.limits.items()
        )


def clock_time(value: str) -> float:
    """An ISO 8601 time (``2026-05-01T14:30:00Z``; without a zone: local), or a local clock
    time today (``14:30``, ``14:30:05``): seconds since the epoch."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        pass
    try:
        clock = dt_time.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a time (2026-05-01T14:30:00Z, or 14:30 today)"
        ) from None
    return datetime.combine(datetime.now().date(), clock).timestamp()


def metadata_item(value: str) -> tuple[str, str | int | float | bool]:
    """``KEY=TEXT`` (a string), or ``KEY:=JSON`` (a number or true/false)."""
    key, typed, raw = value.partition(":=")
    if not typed:
        key, equals, raw = value.partition("=")
        if not equals or not key:
            raise ValueError(f"{value!r} is not KEY=VALUE (or KEY:=NUMBER)")
        return key, raw
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not key or isinstance(parsed, dict | list) or parsed is None:
        raise ValueError(f"{value!r}: KEY:= takes a number, true or false")
    return key, parsed


def http_url(value: str) -> str:
    """An http(s) URL with a host."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL, e.g. {DEFAULT_URL}")
    return value


def an_id(value: str) -> str:
    """Not empty: an empty id would make another URL (``/v1/runs/`` is the list)."""
    if not value:
        raise ValueError("an empty id: give one")
    return value


URL = Parsed(http_url, "url")
ID = Parsed(an_id, "id")
TIME = Parsed(clock_time, "time")
METADATA = Parsed(metadata_item, "key=value")
