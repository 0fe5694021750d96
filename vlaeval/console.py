"""Console output at the edge: rich progress bars and summary tables (plain text when piped)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
error_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

DECISION_STYLE = {"PASS": "green", "REGRESSION": "bold red", "INSUFFICIENT": "yellow",
                  "LAUNCH": "bold green", "DO_NOT_LAUNCH": "bold red", "NEEDS_REVIEW": "bold yellow", "FAIL": "red", "differs": "bold red",
                  "identical": "green"}


def styled(text: str) -> str:
    style = DECISION_STYLE.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


@contextlib.contextmanager
def unit_progress(description: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar over units; yields update(completed=..., description=...)."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True,
                        disable=not console.is_terminal)
    with progress:
        task = progress.add_task(description, total=total)

        def update(completed: Optional[int] = None, description: Optional[str] = None) -> None:
            progress.update(task, completed=completed, description=description or progress.tasks[task].description)

        yield update


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for column in columns:
        t.add_column(column, overflow="fold")
    for row in rows:
        t.add_row(*[styled(fmt(v)) if isinstance(v, str) else fmt(v) for v in row])
    return t


def show(renderable: Any) -> None:
    console.print(renderable)


def print_error(message: str) -> None:
    # The message is literal text: paths and overrides hold brackets rich would read as markup.
    error_console.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, soft_wrap=True)


def print_checks(title: str, checks: Mapping[str, bool]) -> None:
    show(table(title, ["check", "result"], [(name, "PASS" if ok else "FAIL") for name, ok in checks.items()]))

