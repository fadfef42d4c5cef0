"""Rich progress bars with items/s, shared by the stages (a no-op when output is not wanted)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(TaskProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {task.fields.get('unit', 'it')}/s" if speed else "", style="progress.data.speed")


class StageProgress:
    """One bar per unit of work; ``track(description, total, unit)`` yields an ``advance(n)`` function, and
    ``status(message)`` shows a spinner with the elapsed time for work of unknown length (model loads, scoring,
    dbt builds). Both draw on the terminal only (nothing when output is piped or progress is off)."""

    def __init__(self, console: Console | None = None, enabled: bool = True):
        self.enabled = enabled
        self.console = console or Console(stderr=True)

    @contextmanager
    def status(self, message: str) -> Iterator[None]:
        if not self.enabled or not self.console.is_terminal:
            yield
            return
        columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn()]
        with Progress(*columns, console=self.console, transient=True) as progress:
            progress.add_task(message, total=None)
            yield

    @contextmanager
    def track(self, description: str, total: int, unit: str = "it") -> Iterator:
        if not self.enabled:
            yield lambda n=1: None
            return
        # descriptions hold dataset and model names: shown as they are, never read as Rich markup
        columns = [TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), RateColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task(description, total=total, unit=unit)
            yield lambda n=1: progress.advance(task, n)
