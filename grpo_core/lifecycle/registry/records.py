"""What a model registry holds: versions (every gated policy, promoted or refused), the champion, and the events
that moved it; the one interface every registry kind implements."""
from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import pydantic

Decision = Literal["promoted", "refused"]
Action = Literal["promoted", "refused", "promote", "rollback"]  # the gate's two, then a person's two


class RegistryError(ValueError):
    """A request the registry cannot carry out as asked (an unknown version, nothing to roll back to)."""


class RegistryUnavailable(RuntimeError):
    """The registry cannot be reached or written; nothing was changed by the call that raised this (unless its
    message says that the store stopped answering after the change was committed)."""


class RegistryCorrupt(RegistryUnavailable):
    """The registry's store is there but is not a registry: an empty or corrupt file, a record that does not parse.
    Never taken for "no registry yet" (that is a store that does not exist): a gate finding one promotes nothing, and
    a person repairs it (restores the file, or removes it to start a new registry)."""


def one_line(err: BaseException) -> str:
    """An error as one line, for messages (SQLAlchemy's and pydantic's run over several)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def status_line(line: str) -> None:
    """A line for a person watching (the lock's waiting line): stderr, so that a command's JSON on stdout stays JSON."""
    print(line, file=sys.stderr, flush=True)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class ModelVersion:
    """One registered policy. ``version`` and ``registered_at`` are assigned by the registry (0 and "" before)."""

    run: str                          # the run that trained it
    root: str                         # that run's storage.root
    policy: str                       # URL of its policy folder (the run's final/)
    policy_version: int               # the learner step of those weights
    decision: Decision                # the gate's decision when it was registered
    reason: str                       # the gate's reason, in words
    metrics: dict[str, float | None]  # its gate figures (and every eval/<set>/... figure measured; null: nothing was)
    lineage: dict[str, Any]           # parent model, data files (size, sha256), resolved config, code commit
    compared_with: int | None = None  # the champion version it was evaluated against (None: there was none)
    champion_metrics: dict[str, float | None] | None = None  # that champion's figures in the same evaluation
    version: int = 0
    registered_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> "ModelVersion":
        """A stored record (ValueError, one line: it is not one). Stored, it has its number and time."""
        return validated(cls, doc, required=("version", "registered_at"))

    def summary(self) -> dict[str, Any]:
        """What `grpo registry show` lists per version: no lineage (``--lineage`` walks that)."""
        return {k: v for k, v in self.to_json().items() if k not in ("lineage", "champion_metrics")}


@dataclass(frozen=True)
class RegistryEvent:
    """A change of champion (or a refusal): who, when, why."""

    action: Action
    version: int                  # the version the event is about
    champion_before: int | None
    champion_after: int | None
    by: str                       # "gate (run NAME)" or "person (USER)"
    reason: str
    at: str = field(default_factory=utc_now)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> "RegistryEvent":
        """A stored event (ValueError, one line: it is not one). Stored, it has its time."""
        return validated(cls, doc, required=("at",))


Record = TypeVar("Record")


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def validated(cls: type[Record], doc: Any, required: tuple[str, ...] = ()) -> Record:
    """``doc`` read as a ``cls`` (a dataclass of this module), field types checked by pydantic, the fields in
    ``required`` present even where ``cls`` has a default for them (a stored record is never completed with a made-up
    value); ValueError naming each field that is missing or wrong, on one line."""
    problems = [f"{name}: Field required" for name in required if isinstance(doc, dict) and name not in doc]
    try:
        record = _adapter(cls).validate_python(doc)
    except pydantic.ValidationError as err:
        problems += [f"{'.'.join(map(str, e['loc'])) or 'the document'}: {e['msg']}" for e in err.errors()]
    if problems:
        raise ValueError(f"not a {cls.__name__} record ({'; '.join(problems)})")
    return record


class ModelRegistry(Protocol):
    """A registry of one model's versions. Every method raises `RegistryUnavailable` when the store cannot be
    reached, having changed nothing (`RegistryCorrupt` when it is there but is not a registry); `record` and
    `set_champion` are all-or-nothing: under a fault at any step a reader sees the registry as it was before the
    call or as it is after it, never between."""

    location: str  # where it is, for messages

    def champion(self) -> ModelVersion | None: ...

    def versions(self) -> list[ModelVersion]: ...

    def events(self) -> list[RegistryEvent]: ...

    def record(self, candidate: ModelVersion, by: str) -> ModelVersion:
        """Register ``candidate`` as a new version, with the event of its gate's decision (``candidate.decision``:
        promoted, the champion moves to it; refused, it does not). Returns the version with its number and time."""
        ...

    def set_champion(self, version: int, action: Action, by: str, reason: str) -> None:
        """A person's promotion or rollback: the champion becomes ``version`` (RegistryError: no such version)."""
        ...

    def lock(self, on_wait: Callable[[str], None] = status_line) -> AbstractContextManager[None]:
        """Held while a gate reads the champion, evaluates it and records its decision: one promotion at a time."""
        ...


def version_of(versions: list[ModelVersion], number: int, location: str) -> ModelVersion:
    for v in versions:
        if v.version == number:
            return v
    known = ", ".join(str(v.version) for v in versions) or "none"
    raise RegistryError(f"{location} has no version {number} (versions: {known})")
