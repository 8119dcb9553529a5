"""Prefix closure of a set of chained blocks: is every member's parent also a member?

A set is prefix-closed when each member's whole chain up to the root is in it. Then, walking any
request's chain, membership is true up to some block and false after it, so the first miss can be
found by binary search instead of a block-by-block walk. The tracker counts "orphans" (members
whose parent is not a member) under adds and removes; zero orphans means prefix-closed.
"""

from __future__ import annotations

from collections.abc import Callable

UNKNOWN_PARENT = -1  # parent of a block known only from a snapshot
# Block hashes are unsigned 64-bit ints, never negative, so -1 cannot collide with a real parent.


class PrefixClosure:
    """Orphan count of one block set; the caller keeps the set and passes its membership test."""

    __slots__ = ("kids", "orphans")

    def __init__(self) -> None:
        self.kids: dict[int, int] = {}  # parent hash -> members whose parent it is
        self.orphans = 0

    def added(self, block: int, parent: int | None, member: Callable[[int], bool]) -> int:
        """Call after `block` joined the set; returns the change in orphans."""
        delta = -self.kids.get(block, 0)  # its member children were orphans until now
        if parent == UNKNOWN_PARENT:
            delta += 1
        elif parent is not None:
            self.kids[parent] = self.kids.get(parent, 0) + 1
            if not member(parent):
                delta += 1
        self.orphans += delta
        return delta

    def removed(self, block: int, parent: int | None, member: Callable[[int], bool]) -> int:
        """Call after `block` left the set (with the parent it was added with)."""
        delta = self.kids.get(block, 0)  # its member children become orphans
        if parent == UNKNOWN_PARENT:
            delta -= 1
        elif parent is not None:
            left = self.kids[parent] - 1
            if left:
                self.kids[parent] = left
            else:
                del self.kids[parent]
            if not member(parent):
                delta -= 1
        self.orphans += delta
        return delta
