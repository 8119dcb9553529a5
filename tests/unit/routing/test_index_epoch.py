"""PrefixIndex and publisher epochs: a restarted publisher (numbers from 1 again, larger epoch) is
followed and what it held before is dropped; a past epoch's late events are ignored."""

from __future__ import annotations

from rackserve.kv.block_hash import block_hashes
from rackserve.kv.events import EventSequencer, Publisher
from rackserve.routing import PrefixIndex

BS = 16
CHAIN = block_hashes(list(range(500, 500 + 8 * BS + 3)), BS, "m")
RANK = Publisher("prefill-0", 1)


def _rank_hit_tokens(idx: PrefixIndex) -> int:
    return idx.match(CHAIN, BS, 8 * BS + 3).hit((RANK.instance, RANK.dp_rank)).rank_hbm


def test_a_restarted_rank_counting_from_one_again_is_followed_not_ignored():
    idx = PrefixIndex()
    first = EventSequencer(RANK, epoch=100)
    for i in range(5):  # seq 1..5 of the first incarnation: blocks 0..4
        idx.apply(first.make("stored", "rank_hbm", (CHAIN[i],), CHAIN[i - 1] if i else None))
    assert _rank_hit_tokens(idx) == 5 * BS
    again = EventSequencer(RANK, epoch=200)  # the actor restarted empty, then cached 2 blocks
    assert idx.apply(again.make("stored", "rank_hbm", tuple(CHAIN[:2])))
    assert _rank_hit_tokens(idx) == 2 * BS  # the old 5 blocks are gone with the old incarnation
    assert idx.last_seq(RANK) == 1 and not idx.is_stale(RANK)


def test_a_new_epoch_clears_a_stale_mark_and_old_epochs_are_ignored():
    idx = PrefixIndex()
    old = EventSequencer(RANK, epoch=100)
    idx.apply(old.make("stored", "rank_hbm", tuple(CHAIN[:3])))
    old.make("stored", "rank_hbm", (CHAIN[3],), CHAIN[2])  # lost on the way
    idx.apply(old.make("stored", "rank_hbm", (CHAIN[4],), CHAIN[3]))
    assert idx.is_stale(RANK)  # a gap
    new = EventSequencer(RANK, epoch=300)
    idx.apply(new.make("cleared", "rank_hbm"))
    assert not idx.is_stale(RANK) and _rank_hit_tokens(idx) == 0
    late = old.make("stored", "rank_hbm", tuple(CHAIN[:6]))  # the old epoch's, replayed late
    assert idx.apply(late) is False and _rank_hit_tokens(idx) == 0


def test_replaying_a_stream_with_a_restart_twice_changes_nothing():
    events = []
    a, b = EventSequencer(RANK, epoch=1), EventSequencer(RANK, epoch=2)
    events.append(a.make("stored", "rank_hbm", tuple(CHAIN[:4])))
    events.append(b.make("stored", "rank_hbm", tuple(CHAIN[:3])))
    idx = PrefixIndex()
    assert idx.apply_all(events) == 2
    snap = idx.snapshot()
    assert idx.apply_all(events) == 0 and idx.snapshot() == snap


def test_restamp_renumbers_someone_elses_events_in_this_epoch():
    engine_side = EventSequencer(RANK)  # e.g. the engine's block cache, epoch 0, seq 7
    for _ in range(6):
        engine_side.make("stored", "rank_hbm", (CHAIN[0],))
    wire = EventSequencer(RANK, epoch=42)
    out = wire.restamp(engine_side.make("removed", "rank_hbm", (CHAIN[0],)))
    assert (out.kind, out.seq, out.epoch, out.block_hashes) == ("removed", 1, 42, (CHAIN[0],))
    wire.start_over(43)
    assert wire.make("cleared", "rank_hbm").seq == 1
