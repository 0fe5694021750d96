"""Console output at the edge: rich progress bars and summary tables (plain text when piped)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

log = logging.getLogger("vlaeval")
# Piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
error_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

DECISION_STYLE = {
    "PASS": "green",
    "REGRESSION": "bold red",
    "INSUFFICIENT": "yellow",
    "UNDECIDED": "yellow",
    "LAUNCH": "bold green",
    "DO_NOT_LAUNCH": "bold red",
    "NEEDS_REVIEW": "bold yellow",
    "BETTER": "bold green",
    "WORSE": "bold red",
    "NOT_BETTER": "bold red",
    "MIXED": "bold yellow",
    "FAIL": "red",
    "differs": "bold red",
    "identical": "green",
}


def styled(text: str) -> str:
    style = DECISION_STYLE.get(text)
    return f"[{style}]{text}[/{style}]" if style else text


def fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


PLAIN_PROGRESS_EVERY_S = 30.0  # a line at least this often in a non-terminal log
PLAIN_PROGRESS_AFTER_S = 5.0  # and at each tenth of the work once it has run this long (quick work stays quiet)


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """', ETA ~N s' (or min) at the pace so far; empty before the first unit or after the last."""
    if done <= 0 or done >= total:
        return ""
    left = elapsed_s / done * (total - done)
    return f", ETA ~{left:.0f} s" if left < 120 else f", ETA ~{left / 60:.0f} min"


@contextlib.contextmanager
def unit_progress(description: str, total: int) -> Iterator[Callable[..., None]]:
    """Progress over units; yields update(completed=..., total=..., description=...). A terminal
    gets a rich progress bar; a log (Slurm, CI, `| tee`) gets a plain line at every tenth of the
    work once it has run 5 s, and at least every 30 s, so long work is never silent."""
    if console.is_terminal:
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        with progress:
            task = progress.add_task(description, total=total)

            def update(
                completed: Optional[int] = None, description: Optional[str] = None, total: Optional[int] = None
            ) -> None:
                progress.update(
                    task, completed=completed, total=total, description=description or progress.tasks[task].description
                )

            yield update
        return
    state: Dict[str, Any] = {
        "total": max(int(total), 1),
        "tenth": 0,
        "last": time.monotonic(),
        "start": time.monotonic(),
        "description": description,
        "done": 0,
    }

    def plain_update(
        completed: Optional[int] = None, description: Optional[str] = None, total: Optional[int] = None
    ) -> None:
        if total is not None:
            state["total"] = max(int(total), 1)
        if description is not None:
            state["description"] = description
        if completed is None:
            return
        state["done"] = int(completed)
        tenth = min(10, int(10 * state["done"] / state["total"]))
        now = time.monotonic()
        slow = now - state["start"] >= PLAIN_PROGRESS_AFTER_S
        if (tenth > state["tenth"] and slow) or now - state["last"] >= PLAIN_PROGRESS_EVERY_S:
            state["tenth"], state["last"] = max(tenth, state["tenth"]), now
            elapsed = now - state["start"]
            line = (
                f"[progress] {state['description']}: {state['done']:,}/{state['total']:,} "
                f"({state['done'] / state['total']:.0%}, {elapsed:.0f} s{eta_text(elapsed, state['done'], state['total'])})"
            )
            console.print(line, markup=False)
            log.info(line)

    yield plain_update


@contextlib.contextmanager
def strata_progress() -> Iterator[Callable[..., None]]:
    """One progress bar per stratum; yields update(stratum, completed, total, detail, final). A
    terminal gets a rich bar per stratum as it starts (units, then `detail`: clusters, e-values,
    the decision); a log gets a plain line per stratum when it ends (`final`) and otherwise at most
    every PLAIN_PROGRESS_EVERY_S seconds, so long strata are never silent."""
    if console.is_terminal:
        progress = Progress(
            TextColumn("{task.fields[stratum]:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
        )
        tasks: Dict[str, Any] = {}
        with progress:

            def update(stratum: str, completed: int, total: int, detail: str = "", final: bool = False) -> None:
                if stratum not in tasks:
                    tasks[stratum] = progress.add_task("", total=max(int(total), 1), stratum=stratum, detail=detail)
                progress.update(tasks[stratum], completed=completed, total=max(int(total), 1), detail=detail)
                if final:
                    progress.stop_task(tasks[stratum])

            yield update
        return
    start = time.monotonic()
    last: Dict[str, float] = {}

    def plain_update(stratum: str, completed: int, total: int, detail: str = "", final: bool = False) -> None:
        now = time.monotonic()
        if final or now - last.setdefault(stratum, start) >= PLAIN_PROGRESS_EVERY_S:
            last[stratum] = now
            line = f"[progress] {stratum}: {completed:,}/{total:,} units, {detail} ({now - start:.0f} s)"
            console.print(line, markup=False)
            log.info(line)

    yield plain_update


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for column in columns:
        t.add_column(column, overflow="fold")
    for row in rows:
        t.add_row(*[styled(fmt(v)) if isinstance(v, str) else fmt(v) for v in row])
    return t


def _plain_text(renderable: Any) -> str:
    """What a renderable prints, without colour or markup (for the run's log file)."""
    buffer = Console(file=io.StringIO(), width=160, color_system=None, highlight=False)
    buffer.print(renderable)
    return buffer.file.getvalue().rstrip()  # type: ignore[attr-defined]


def show(renderable: Any) -> None:
    """Print to the console, and the same text to the `vlaeval` logger: Hydra writes it to the run's
    <job>.log (main.log), so the log holds what the console showed."""
    console.print(renderable)
    if log.isEnabledFor(logging.INFO):
        log.info(_plain_text(renderable))


def print_error(message: str) -> None:
    # The message is literal text: paths and overrides hold brackets rich would read as markup.
    error_console.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, soft_wrap=True)
    log.info("error: %s", message)  # to the run's log file only (the console handler shows warnings and up)


def print_notice(message: str) -> None:
    """What the run is about to spend time on, and how to spend less (stdout and the run's log)."""
    console.print(f"[bold]note:[/bold] {escape(message)}", markup=True, soft_wrap=True)
    log.info("note: %s", message)


def print_warning(message: str) -> None:
    """A warning: the run goes on (print_error is for what stopped it)."""
    error_console.print(f"[bold yellow]warning:[/bold yellow] {escape(message)}", markup=True, soft_wrap=True)
    log.info("warning: %s", message)


def print_checks(title: str, checks: Mapping[str, bool]) -> None:
    show(table(title, ["check", "result"], [(name, "PASS" if ok else "FAIL") for name, ok in checks.items()]))
