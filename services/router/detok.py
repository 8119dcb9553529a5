"""Incremental detokenization with stop strings: turns a token stream into safe text deltas.

Text is released only when it cannot change: a cut multi-byte UTF-8 character, or a tail that
could still become a stop string, is held back until the next token decides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rackserve.model import tokenizer


@dataclass
class Detokenizer:
    stops: list[str] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _sent: int = 0  # characters of the text already released
    stopped: bool = False

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text that is now final. Sets `stopped` on a stop string."""
        self._ids.extend(token_ids)
        text = tokenizer.decode(self._ids)
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped = True
            return self._release(text[:cut])
        safe = len(text)
        if text.endswith("\ufffd"):
            safe -= 1  # maybe half a character
        hold = max((len(s) - 1 for s in self.stops), default=0)
        return self._release(text[: max(self._sent, safe - hold)])

    def flush(self) -> str:
        """At the end of the stream: release what was held back (no stop string matched)."""
        if self.stopped:
            return ""
        return self._release(tokenizer.decode(self._ids))

    def _stop_at(self, text: str) -> int | None:
        found = [
            i for i in (text.find(s, max(0, self._sent - len(s))) for s in self.stops) if i >= 0
        ]
        return min(found) if found else None

    def _release(self, text: str) -> str:
        delta = text[self._sent :]
        self._sent = len(text)
        return delta
