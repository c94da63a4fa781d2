"""Every Redis error reply is classified in one place (``_redis.py``): unavailable (the bus waits it
out), misconfigured (an operator must act), or a defect. The cases are generated from the table
and from redis-py's own parser, so a code added to either is covered; the same replies from a real
server (and through a proxy that answers them) are in test_error_replies.py."""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cancel_bus import BusMisconfigured, BusUnavailable, CancelBusError
from cancel_bus._redis import REPLY_CODES, Failure, failure_of, translated

ERRORS = {
    Failure.UNAVAILABLE: BusUnavailable,
    Failure.MISCONFIGURED: BusMisconfigured,
    Failure.DEFECT: CancelBusError,
}
# ERR replies (redis-py keeps them as ResponseError) and what they mean
ERR_REPLIES = {
    "ERR unknown command 'EVALSHA', with args beginning with: ": Failure.MISCONFIGURED,
    "ERR unknown subcommand 'GET'. Try CONFIG HELP.": Failure.MISCONFIGURED,
    "ERR This instance has cluster support disabled": Failure.MISCONFIGURED,
    "ERR Error running script (call to f_1): @user_script:3: -OOM command not allowed": (
        Failure.UNAVAILABLE
    ),
    "ERR user_script:12: Script attempted to access nonexistent global variable": Failure.DEFECT,
    "WRONGTYPE Operation against a key holding the wrong kind of value": Failure.DEFECT,
    "CROSSSLOT Keys in request don't hash to the same slot": Failure.DEFECT,
    "EXECABORT Transaction discarded because of previous errors.": Failure.DEFECT,
}


# what follows the code in a real reply, where redis-py reads it
TEXTS = {"ASK": "3999 127.0.0.1:6381", "MOVED": "3999 127.0.0.1:6381"}


def _parsed(reply: str) -> Exception:
    """The exception redis-py raises for the error reply ``reply`` (its own parser)."""
    return BaseParser.parse_error(reply)


def _translated(exc: Exception) -> BaseException:
    with pytest.raises(CancelBusError) as caught, translated("call"):
        raise exc
    assert caught.value.__cause__ is exc
    return caught.value


@pytest.mark.parametrize("code", sorted(REPLY_CODES))
def test_every_listed_reply_code_is_classified(code: str) -> None:
    text = TEXTS.get(code, "the server's words")
    exc = _parsed(f"{code} {text}")
    assert failure_of(exc) is REPLY_CODES[code]
    error = _translated(exc)
    assert type(error) is ERRORS[REPLY_CODES[code]]
    assert code in str(error) or type(exc).__name__ in str(error)  # one line: what it was
    assert text in str(error) and "\n" not in str(error)


@pytest.mark.parametrize("code", [c for c in BaseParser.EXCEPTION_CLASSES if c != "ERR"])
def test_every_reply_redis_py_maps_to_a_class_is_classified_by_its_code(code: str) -> None:
    exc = _parsed(f"{code} {TEXTS.get(code, 'text')}")
    expected = REPLY_CODES.get(code, Failure.DEFECT)
    assert failure_of(exc) is expected, f"{code} ({type(exc).__name__})"


@pytest.mark.parametrize(("reply", "failure"), ERR_REPLIES.items())
def test_err_replies_are_classified_by_their_words(reply: str, failure: Failure) -> None:
    assert failure_of(_parsed(reply)) is failure
    assert type(_translated(_parsed(reply))) is ERRORS[failure]


@pytest.mark.parametrize(
    "exc",
    [
        RedisConnectionError("Connection refused"),
        RedisTimeoutError("Timeout reading from socket"),
        ConnectionResetError("reset by peer"),
        RuntimeError(
            "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
        ),
    ],
)
def test_connection_failures_are_unavailability(exc: Exception) -> None:
    assert type(_translated(exc)) is BusUnavailable


def test_a_wrong_password_is_a_misconfiguration_not_an_outage() -> None:
    for reply in ("WRONGPASS invalid username-password pair", "NOAUTH Authentication required."):
        assert type(_translated(_parsed(reply))) is BusMisconfigured
        assert isinstance(_translated(_parsed(reply)), BusUnavailable)  # still unavailable


def test_a_bad_call_of_ours_is_a_defect_and_other_errors_pass_through() -> None:
    assert type(_translated(DataError("Invalid input of type: 'dict'"))) is CancelBusError
    with pytest.raises(KeyError), translated("call"):
        raise KeyError("not Redis's")
    assert failure_of(ResponseError("no code here")) is Failure.DEFECT
