"""Modal screens: the key map (``?``) and the export dialog."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

#: keys Textual names differently from what is printed on them
_KEY_NAMES = {"question_mark": "?", "slash": "/", "plus": "+", "minus": "-", "equals_sign": "=",
              "left_square_bracket": "[", "right_square_bracket": "]", "left": "←", "right": "→", "up": "↑",
              "down": "↓", "shift+left": "shift+←", "shift+right": "shift+→", "escape": "esc", "enter": "enter",
              "ctrl+p": "ctrl+p", "pageup": "pgup", "pagedown": "pgdn"}


def key_names(binding: Binding) -> str:
    """All the keys of a binding as printed on a keyboard: ``"+ = i"``."""
    return " ".join(_KEY_NAMES.get(k.strip(), k.strip()) for k in binding.key.split(","))


def _bindings(items: Iterable[BindingType]) -> list[Binding]:
    out = []
    for b in items:
        if isinstance(b, Binding):
            out.append(b)
        elif isinstance(b, tuple):
            out.append(Binding(*b))  # type: ignore[arg-type]
    return out


def split_columns(heights: list[int], columns: int) -> list[int]:
    """How many of the sections (of ``heights`` rows, in order) go into each of at most ``columns``
    columns so that the tallest column is as short as it can be."""
    n = len(heights)
    if n <= columns:
        return [1] * n
    best: tuple[int, list[int]] | None = None

    def place(start: int, left: int, counts: list[int]) -> None:
        nonlocal best
        if left == 1:
            counts = [*counts, n - start]
            tallest, k = 0, 0
            for c in counts:
                tallest = max(tallest, sum(heights[k:k + c]))
                k += c
            if best is None or tallest < best[0]:
                best = (tallest, counts)
            return
        for c in range(1, n - start - left + 2):
            place(start + c, left - 1, [*counts, c])

    place(0, columns, [])
    assert best is not None
    return best[1]


class HelpScreen(ModalScreen[None]):
    """Every key of the app, by view, generated from the bindings themselves."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, Iterable[BindingType]]], mouse: list[tuple[str, str]]) -> None:
        super().__init__()
        self.sections = sections
        self.mouse = mouse

    def _table(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> Table:
        table = Table(box=None, show_header=False, pad_edge=False, expand=True)
        table.add_column("key", style="bold", no_wrap=True, width=17)
        table.add_column("what")
        for i, (title, rows) in enumerate(sections):
            if i:
                table.add_row("", "")
            table.add_row(Text(title, style="bold underline"), "")
            for key, what in rows:
                table.add_row(key, what)
        return table

    def compose(self) -> ComposeResult:
        sections = [(title, [(key_names(b), b.description) for b in _bindings(items) if b.description])
                    for title, items in self.sections]
        sections = [(t, rows) for t, rows in sections if rows]
        if self.mouse:
            sections.append(("Mouse (timeline)", list(self.mouse)))
        columns = split_columns([len(rows) + 2 for _, rows in sections], 3)
        with Vertical(id="help-box"):
            with VerticalScroll(), Horizontal(id="help-columns"):
                start = 0
                for i, n in enumerate(columns):
                    yield Static(self._table(sections[start:start + n]), id=f"help-keys-{i + 1}",
                                 classes="help-column")
                    start += n
            yield Label("esc, q or ?: close", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Keys"


class ExportScreen(ModalScreen["tuple[str, bool] | None"]):
    """Ask where to export; dismisses with ``(path, overwrite)`` or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str, explanation: str) -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.explanation = explanation

    def compose(self) -> ComposeResult:
        with Vertical(id="export-box"):
            yield Label(self.explanation, classes="hint")
            yield Input(self.default, id="export-path")
            yield Checkbox("overwrite existing files", id="export-force")
            with Horizontal(id="export-buttons"):
                yield Button("Export", variant="primary", id="export-ok")
                yield Button("Cancel", id="export-cancel")

    def on_mount(self) -> None:
        self.query_one("#export-box").border_title = self.title_text
        self.query_one("#export-path", Input).focus()

    def _submit(self) -> None:
        path = self.query_one("#export-path", Input).value.strip()
        if path:
            self.dismiss((path, self.query_one("#export-force", Checkbox).value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "export-ok":
            self._submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
