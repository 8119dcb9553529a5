import numpy as np
import pytest

from rackserve.workload.trace_blocks import block_ids, next_block_ids, prompt_token_ids

IDS = np.arange(1, 41, dtype=np.uint64)  # 40 trace blocks = 2,560 tokens


@pytest.mark.parametrize(("block", "scale"), [(64, 1.0), (128, 1.0), (16, 1.0), (16, 0.25), (16, 0.03)])
def test_incremental_ids_equal_a_fresh_computation(block, scale):
    grown = np.concatenate([IDS, np.arange(500, 510, dtype=np.uint64)])
    forked = np.concatenate([IDS[:25], np.arange(900, 915, dtype=np.uint64)])
    prev = next_block_ids(None, IDS, 7, round(2560 * scale) + 3, block, scale, tail=1)
    for nxt, n_tok in ((grown, 3200), (forked, 2560)):
        n = round(n_tok * scale) + 5
        inc = next_block_ids(prev, nxt, 7, n, block, scale, tail=2)
        fresh = block_ids(nxt, 7, n, block, scale, tail=2)
        assert inc.as_tuple == tuple(fresh.tolist()) and np.array_equal(inc.ids, fresh)


def test_block_ids_follow_prefix_identity_and_salt():
    a = block_ids(IDS, 1, 2560)
    b = block_ids(np.concatenate([IDS[:10], IDS[10:] + 100]), 1, 2560)
    assert a.size == 40 and (a[:10] == b[:10]).all() and not set(a[10:]) & set(b[10:])
    assert not set(block_ids(IDS, 2, 2560)) & set(a)  # another lane's salt shares nothing


def test_prompt_tokens_share_exactly_the_common_trace_prefix():
    scale = 0.25  # a 64-token trace block becomes 16 tokens
    a = prompt_token_ids(IDS, 3, 640, scale)
    b = prompt_token_ids(np.concatenate([IDS[:20], IDS[20:] + 100]), 3, 640, scale)
    assert a.max() < 256 and (a[:320] == b[:320]).all() and (a[320:] != b[320:]).mean() > 0.9
    tail = prompt_token_ids(IDS[:2], 3, 40, scale, tail=5)  # 32 tokens of 2 trace blocks + 8 of tail
    assert (tail[:32] == a[:32]).all() and (tail[32:] != prompt_token_ids(IDS[:2], 3, 40, scale, tail=6)[32:]).any()


def test_block_hashes_read_as_their_tuple_without_converting_all():
    from rackserve.sim.block_keys import BlockKeys

    ids = next_block_ids(None, IDS, 7, 2560 + 3).as_tuple  # 40 blocks
    want = tuple(block_ids(IDS, 7, 2563).tolist())
    keys = BlockKeys.of(ids, 16)  # what the simulator reads: group keys, then blocks near the tail
    assert keys.keys == want[15::16] + (want[-1],) and keys.n_blocks == 40
    assert keys.refine(2, lambda span: {want[35]} & set(span)) == 4 and keys.blocks[39] == want[39]
    assert ids._tuple is None  # no tuple of all 40 ints was made
    assert ids == want and hash(ids) == hash(want) and list(ids) == list(want) and ids[3:5] == want[3:5]


def test_the_c_pass_gives_the_numpy_ids_bit_for_bit():
    """next_block_ids' one C pass (workload/_blockids.c) against its numpy reference: random trace ids
    over the whole 64-bit range, salts and tails at their edges, block sizes that split or merge
    trace blocks, prompts past the trace's last block (tail content), kept prefixes."""
    from rackserve.workload import trace_blocks as tb

    if tb._fill is None:
        pytest.skip("the C pass is not built (no C compiler)")
    rng = np.random.default_rng(5)
    for case in range(400):
        n = int(rng.integers(0, 60))
        ids = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
        block = int(rng.choice([16, 32, 64, 128, 512]))
        salt = [0, 2**64 - 1, int(rng.integers(0, 2**63)) * 2 + 1][int(rng.integers(0, 3))]  # Python ints
        tail = [0, 2**63 - 1, int(rng.integers(0, 2**62))][int(rng.integers(0, 3))]
        prompt = int(rng.integers(0, (n + 3) * 64 + 1))
        prev = tb.next_block_ids_numpy(None, ids, salt, prompt, block, tail=tail)
        grown = np.concatenate([ids[: int(rng.integers(0, n + 1))], rng.integers(0, 2**64, size=5, dtype=np.uint64)])
        later = prompt + int(rng.integers(0, 700))
        for before, now, tokens in ((None, ids, prompt), (prev, grown, later)):
            want = tb.next_block_ids_numpy(before, now, salt, tokens, block, tail=tail)
            got = tb.next_block_ids(before, now, salt, tokens, block, tail=tail)
            assert got.ids.dtype == np.uint64 and np.array_equal(got.ids, want.ids), (case, block, tokens)
            assert got.as_tuple == want.as_tuple


def test_the_c_pass_names_bad_arguments():
    from rackserve.workload import trace_blocks as tb

    if tb._fill is None:
        pytest.skip("the C pass is not built (no C compiler)")
    out = np.empty(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="keep"):
        tb._fill(out, np.zeros(2, dtype=np.uint64), 3, IDS, 1, 0, 64)  # keeps more than prev has
    with pytest.raises(ValueError, match="block_tokens"):
        tb._fill(out, tb._NONE, 0, IDS, 1, 0, 0)
    with pytest.raises(ValueError, match="8-byte"):
        tb._fill(np.empty(4, dtype=np.uint32), tb._NONE, 0, IDS, 1, 0, 64)
    with pytest.raises(TypeError):
        tb._fill(IDS.tobytes(), tb._NONE, 0, IDS, 1, 0, 64)  # bytes: not writable


@pytest.mark.parametrize("group", [1, 3, 8])
def test_group_keys_of_a_turn_reuse_its_predecessors_ints(group):
    """A turn's group keys (BlockKeys.of: every group's last block id) equal ids[group - 1::group]
    computed afresh; those within the ids it shares with the previous turn are that turn's own int
    objects (only the new groups' are converted), and a turn that forks keeps only the shared ones."""
    from rackserve.sim.block_keys import BlockKeys

    rng = np.random.default_rng(group)
    hist = rng.integers(1, 2**63, size=30, dtype=np.uint64)
    prev, prev_keys, reused = None, None, 0
    for turn in range(12):
        if turn % 5 == 4:  # a fork: the trace rewrote part of the history
            hist = np.concatenate([hist[: len(hist) // 2], rng.integers(1, 2**63, size=5, dtype=np.uint64)])
        hist = np.concatenate([hist, rng.integers(1, 2**63, size=int(rng.integers(1, 9)), dtype=np.uint64)])
        tokens = len(hist) * 64 - int(rng.integers(0, 64))
        ids = next_block_ids(prev, hist, 9, tokens, 64, tail=turn)
        keys = BlockKeys.of(ids.as_tuple, group)
        want = tuple(ids.ids[group - 1 :: group].tolist())
        if ids.ids.size % group:
            want += (int(ids.ids[-1]),)
        assert keys.keys == want and keys.n_blocks == ids.ids.size
        if prev_keys is not None:
            n = min(prev.ids.size, ids.ids.size)
            differ = np.flatnonzero(prev.ids[:n] != ids.ids[:n])
            shared = int(differ[0]) if differ.size else n
            k = min(shared // group, len(prev_keys))
            reused += k
            assert all(keys.keys[i] is prev_keys[i] for i in range(k))  # the same int objects
        prev, prev_keys = ids, ids.as_tuple.group_keys(group)
    assert reused > 0
