"""The envelope every event shares (``Event``) and the decorator that makes an event class.

Apart from the event families because each of them builds on it, and because what it costs
to define an event class (the value methods written once here, not per class) is decided
in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

SCHEMA_VERSION = 1

_E = TypeVar("_E")
# Per event class, its field names in order and a getter of its values as a tuple.
_NAMES: dict[type, tuple[str, ...]] = {}
_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _event_dataclass(cls: type[_E]) -> type[_E]:
    """``@dataclass(frozen=True, slots=True, kw_only=True)``, with the value methods
    (``__eq__``, ``__hash__``, ``__repr__``) those would generate per class defined once, on
    ``Event``, over the class's fields: the same results (equal when of the same class with
    equal fields, the hash of the fields' tuple, ``Name(field=value, ...)``). Generating
    them compiled three functions per class, half of what importing this module cost every
    process at start (about 20 ms of 40 classes)."""
    made = dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)(cls)
    names = tuple(f.name for f in dataclasses.fields(made))  # type: ignore[arg-type]
    _NAMES[made] = names
    _VALUES[made] = attrgetter(*names)  # >1 name: a tuple of the values
    return made


if TYPE_CHECKING:  # what the type checker knows: the frozen keyword-only dataclasses they are
    from typing import dataclass_transform

    @dataclass_transform(frozen_default=True, kw_only_default=True)
    def event_class(cls: type[_E]) -> type[_E]: ...

else:
    event_class = _event_dataclass


@event_class
class Event:
    """The envelope shared by every event."""

    event_id: str
    invocation_id: str
    partition_key: str
    causation_id: str = ""
    correlation_id: str = ""
    occurred_at: int = 0  # epoch milliseconds
    producer: str = ""
    schema_version: int = SCHEMA_VERSION

    TOPIC: ClassVar[str] = "events"

    @property
    def event_type(self) -> str:
        return type(self).__name__

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            values = _VALUES[self.__class__]
            return values(self) == values(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_VALUES[self.__class__](self))

    def __repr__(self) -> str:
        cls = self.__class__
        shown = ", ".join(
            f"{n}={v!r}" for n, v in zip(_NAMES[cls], _VALUES[cls](self), strict=True)
        )
        return f"{cls.__qualname__}({shown})"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
