"""What a run name may be: one safe folder name under ``storage.root``.

Why: the run name becomes a path (``<storage.root>/<run_name>``, locally or an object-store prefix) that the run
writes into, and the names of other runs are read back from the folders there. A name with a ``/`` or a ``..``
would put the run's folder (and everything it writes) outside the root or inside another run; one starting with
``.`` would be hidden from ``grpo runs`` (it skips hidden folders), one starting with ``-`` reads as an option on a
command line. So a name is letters, digits, ``.``, ``_`` and ``-``, starts with neither ``.`` nor ``-``, and is at most
``MAX_RUN_NAME`` characters (file systems allow 255 bytes per name; the rest is left for suffixes a run adds).
A template (``{date}``, ``{time}``) is checked once its placeholders are filled.
"""
from __future__ import annotations

import re

MAX_RUN_NAME = 128
RUN_NAME_ALPHABET = "letters, digits, '.', '_' and '-', not starting with '.' or '-'"
_RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def run_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a run name (in words, without the name itself), or None when it can."""
    if not isinstance(name, str):
        return f"a run name is text, got {type(name).__name__}"
    if not name:
        return "a run name cannot be empty"
    if len(name) > MAX_RUN_NAME:
        return f"a run name is at most {MAX_RUN_NAME} characters, got {len(name)}"
    if not _RUN_NAME.fullmatch(name):
        return f"a run name is one folder name: {RUN_NAME_ALPHABET} (no '/', no spaces)"
    return None
