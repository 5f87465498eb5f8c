"""The base of every config section, and the error a config that cannot be used raises."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Section(BaseModel):
    """A config section: unknown keys refused, assignments validated, and no float anywhere in it (a field, a tuple's,
    list's or dict's entry) may be NaN or infinite: every float of a run's config is a finite quantity (a rate, a
    weight, a bound, seconds), and NaN passes every ``ge``/``le`` bound unnoticed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A config that cannot be used, with the file and field that are wrong."""
