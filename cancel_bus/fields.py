"""The library's limits as pydantic types, for whoever checks input before it reaches the bus
(the node's schemas, settings, queries and CLI): one definition of an id, a text, a label and a
page of a list, so a limit changes in one place."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from ._checks import MAX_HOLD, MAX_LIST_LIMIT, MAX_TEXT
from ._keys import ID_PATTERN, MAX_ID_LENGTH
from ._run import MAX_LABEL

Id = Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)]
OptionalId = Annotated[str | None, Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]  # a reason, a metadata value
Label = Annotated[str, StringConstraints(max_length=MAX_LABEL)]  # a phase, an event type
ListLimit = Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT)]  # runs one list answers, at most
Hold = Annotated[float, Field(gt=0, le=MAX_HOLD)]  # seconds a tombstone may be held

__all__ = [
    "MAX_HOLD",
    "MAX_ID_LENGTH",
    "MAX_LABEL",
    "MAX_LIST_LIMIT",
    "MAX_TEXT",
    "Hold",
    "Id",
    "Label",
    "ListLimit",
    "OptionalId",
    "Text",
]
