"""The user-error type and its one-line form (no dependencies: every module may import it).

A UserInputError is bad input -- a config value, a file, an artifact -- reported as one line that
names the problem and the fix, before any work starts (vlaeval.cli turns it into exit code 2).
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input: reported as one line naming the problem and the fix, before any work starts."""


def require(condition: bool, message: str) -> None:
    """Raise a one-line UserInputError unless `condition` holds."""
    if not condition:
        raise UserInputError(message)


def require_file(path: object, what: str, fix: str) -> None:
    """`what` (e.g. "checkpoint x.pt") names an existing file: a directory in its place is said to
    be one, with the first files it holds (the one meant is likely among them)."""
    from pathlib import Path

    p = Path(str(path))
    if p.is_file():
        return
    if p.is_dir():
        inside = sorted(c.name for c in p.iterdir() if c.is_file() and not c.name.startswith("."))[:3]
        hint = f" (it holds {', '.join(inside)}{', ...' if len(inside) == 3 else ''})" if inside else ""
        raise UserInputError(f"{what} is a directory{hint}; give the file itself: {fix}")
    raise UserInputError(f"{what} does not exist; {fix}")


def require_at_least(name: str, value: float, low: float) -> None:
    """`name`=value must be >= low: the one-line range error every count and size setting shares."""
    require(value >= low, f"{name}={value} must be >= {low}")


def first_line(error: BaseException | str, limit: int | None = None) -> str:
    """The first non-empty line of an error's message (its type name when the message is empty),
    cut at a word boundary to `limit` characters with an ellipsis."""
    text = str(error).strip()
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if not line:
        line = type(error).__name__ if isinstance(error, BaseException) else ""
    if limit is not None and len(line) > limit:
        cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
        line = cut.rstrip(" ,;:") + "..."
    return line


def describe(error: BaseException) -> str:
    """'TypeName: first line' of an error, for logs and run tags."""
    line = first_line(error)
    name = type(error).__name__
    return name if line == name else f"{name}: {line}"
