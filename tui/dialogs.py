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


class HelpScreen(ModalScreen[None]):
    """Every key of the app, by view, generated from the bindings themselves."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, Iterable[BindingType]]], mouse: list[tuple[str, str]]) -> None:
        super().__init__()
        self.sections = sections
        self.mouse = mouse

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, pad_edge=False, expand=True)
        table.add_column("key", style="bold", no_wrap=True, width=22)
        table.add_column("what")
        for title, items in self.sections:
            rows = [b for b in _bindings(items) if b.description]
            if not rows:
                continue
            table.add_row(Text(title, style="bold underline"), "")
            for b in rows:
                table.add_row(key_names(b), b.description)
            table.add_row("", "")
        if self.mouse:
            table.add_row(Text("Mouse (timeline)", style="bold underline"), "")
            for what, does in self.mouse:
                table.add_row(what, does)
        with Vertical(id="help-box"):
            with VerticalScroll():
                yield Static(table, id="help-keys")
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
