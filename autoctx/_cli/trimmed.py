"""Output into a pipe or a file without the spaces rich pads each line with: the commands'
tables and text (`output._console`), and Typer's help and usage errors (`root`)."""

from __future__ import annotations

import io
from typing import TextIO, cast


class TrimmedLines(io.TextIOBase):
    """A pipe or a file as rich writes to it, less the spaces rich pads each line with up to
    the table's width: they are not output, and they break `diff`, `grep 'x$'` and editors."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        if lines:
            self._out.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        # Rich ends every print with a newline; a partial line is written as it is.
        if self._pending:
            self._out.write(self._pending)
            self._pending = ""
        self._out.flush()


def trimmed(stream: TextIO) -> TextIO:
    """`stream` as rich should write to it: as it is on a terminal, trimmed otherwise."""
    if stream.isatty():
        return stream
    # A TextIOBase is what IO[str] stands for at run time; typeshed does not relate the two.
    return cast(TextIO, TrimmedLines(stream))
