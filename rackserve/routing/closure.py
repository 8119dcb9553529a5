"""Prefix closure of a set of chained blocks: is every member's parent also a member?

A set is prefix-closed when each member's whole chain up to the root is in it. Then, walking any
request's chain, membership is true up to some block and false after it, so the first miss can be
found by binary search instead of a block-by-block walk. The tracker counts "orphans" (members
whose parent is not a member) under adds and removes; zero orphans means prefix-closed.

The count is a function of the set alone, so a batch is accounted in one go, in any order:
adding S to X changes it by  #{s in S: parent(s) not in X+S} - #{x in X: parent(x) in S};
removing S from X by  #{x in X-S: parent(x) in S} - #{s in S: parent(s) not in X}.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import repeat

# Parent of a block known only from a snapshot. Block hashes are unsigned 64-bit ints, never
# negative, so -1 cannot collide with a real parent.
UNKNOWN_PARENT = -1


class PrefixClosure:
    """Orphan count of one block set; the caller keeps the set and passes its membership test.

    The batch methods do their per-block work in C (map, Counter.update) because the router
    applies one of them per KV event on every block it stores.
    """

    __slots__ = ("kids", "orphans")

    def __init__(self) -> None:
        self.kids: Counter[int] = Counter()  # parent hash -> members whose parent it is
        self.orphans = 0

    def added_many(
        self, blocks: Sequence[int], parents: Sequence[int | None], member: Callable[[int], bool]
    ) -> int:
        """Call after `blocks` (new members, with their parents) joined the set; returns the
        change in orphans."""
        kids = self.kids
        delta = -sum(map(kids.get, blocks, repeat(0)))  # old members whose parent just arrived
        kids.update(parents)
        kids.pop(None, None)  # roots and unknown parents are nobody's kids
        kids.pop(UNKNOWN_PARENT, None)
        # New orphans: parents that are not members, except None (a chain root).
        delta += len(parents) - sum(map(member, parents)) - parents.count(None)
        self.orphans += delta
        return delta

    def removed_many(
        self, blocks: Sequence[int], parents: Sequence[int | None], member: Callable[[int], bool]
    ) -> int:
        """Call after `blocks` (former members, with the parents they were added with) left the
        set; returns the change in orphans."""
        kids = self.kids
        gone = set(blocks)
        # Orphans among the removed, judged against the set before removal (now + gone).
        held = sum(map(gone.__contains__, parents)) + sum(map(member, parents))
        delta = -(len(parents) - parents.count(None) - held)
        for p in parents:
            if p is not None and p != UNKNOWN_PARENT:
                left = kids[p] - 1
                if left:
                    kids[p] = left
                else:
                    del kids[p]
        delta += sum(map(kids.get, blocks, repeat(0)))  # remaining members that lost their parent
        self.orphans += delta
        return delta

    def added(self, block: int, parent: int | None, member: Callable[[int], bool]) -> int:
        return self.added_many((block,), (parent,), member)

    def removed(self, block: int, parent: int | None, member: Callable[[int], bool]) -> int:
        return self.removed_many((block,), (parent,), member)
