"""The C LRU set (sim/_lruset.c) against its Python reference (an OrderedDict): the same evictions,
order, membership and matches for any sequence of chain stores, keys over the whole 64-bit range."""

from __future__ import annotations

import random
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackserve.sim.lru_set import LruSet, PyLruSet, prefixes, py_prefixes

needs_c = pytest.mark.skipif(LruSet is PyLruSet, reason="the C LRU set is not built (no C compiler)")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_c_set_is_built_where_a_compiler_is() -> None:
    assert LruSet is not PyLruSet, "rackserve/sim/_lruset.c was not built: run `make venv` (pip install -e .)"


EDGE = [0, 1, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 12345]


def _chains(rng: random.Random, n_chains: int, length: int, pool: list[int]) -> list[list[int]]:
    """Chains that share prefixes (a tree of keys), as conversations and shared system prompts do."""
    chains: list[list[int]] = []
    for _ in range(n_chains):
        if chains and rng.random() < 0.6:
            base = rng.choice(chains)
            cut = rng.randint(0, len(base))
            chain = base[:cut]
        else:
            chain = []
        while len(chain) < length:
            chain.append(pool.pop() if pool and rng.random() < 0.05 else rng.getrandbits(64))
        chains.append(chain[: rng.randint(1, length)])
    return chains


def _outcome(store, *args):
    try:
        return store(*args)
    except KeyError as e:
        return ("KeyError", e.args)


def _same(a, b) -> None:
    assert len(a) == len(b)
    assert a.keys() == b.keys()
    assert list(a) == list(b)


@needs_c
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40), st.integers(1, 30), st.booleans())
def test_chain_stores_equal_the_reference(seed: int, capacity: int, length: int, any_held: bool) -> None:
    rng = random.Random(seed)
    chains = _chains(rng, 30, length, list(EDGE))
    c, ref = LruSet(), PyLruSet()
    for _ in range(200):
        chain = rng.choice(chains)
        held = ref.match(chain)
        assert c.match(chain) == held
        if any_held and held:  # any held count: the set may stop being prefix-closed, match may then
            held = rng.randint(0, held)  # overshoot and the touch miss a key (KeyError), alike in both
        assert _outcome(c.store, chain, held, capacity) == _outcome(ref.store, chain, held, capacity)
        _same(c, ref)
        probe = rng.choice(chains)
        assert c.match(probe) == ref.match(probe)
        assert c.among(probe) == ref.among(probe)
        assert all((k in c) == (k in ref) for k in probe)


@needs_c
def test_heavy_churn_keeps_every_key_findable() -> None:
    """Many more keys than the table starts with, evicted and reinserted: the index grows, deletions
    shift probe runs back, freed entries are reused, and the set never loses or invents a key."""
    rng = random.Random(7)
    c, ref = LruSet(), PyLruSet()
    universe = [rng.getrandbits(64) for _ in range(5000)] + [i for i in range(3000)]  # sequential keys collide more
    for step in range(3000):
        chain = rng.sample(universe, rng.randint(1, 20))
        cap = 1000 if step < 2000 else 50
        held = 0  # random keys are no chain: the held prefix by walking, not by bisection
        while held < len(chain) and chain[held] in ref:
            held += 1
        assert c.store(chain, held, cap) == ref.store(chain, held, cap)
    _same(c, ref)
    assert sum(k in c for k in universe) == len(ref) == 50


@needs_c
@pytest.mark.parametrize("cls", [LruSet, PyLruSet])
def test_bad_input_is_refused(cls) -> None:
    s = cls()
    with pytest.raises(TypeError, match="ints"):
        s.store(["a"], 0, 10)
    with pytest.raises(ValueError, match="held"):
        s.store([1, 2], 3, 10)
    with pytest.raises(KeyError):  # a held prefix the set lacks
        s.store([5, 6], 1, 10)
    assert "a" not in s and 2**70 not in s


@needs_c
def test_out_of_range_keys_are_refused_by_the_c_set() -> None:
    s = LruSet()
    with pytest.raises(OverflowError):
        s.store([2**64], 0, 10)
    with pytest.raises(OverflowError):
        s.store([-(2**63) - 1], 0, 10)
    assert s.store([2**64 - 1, -(2**63)], 0, 1) == (-(2**63),)
    assert s.keys() == [2**64 - 1]


@needs_c
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 6))
def test_prefixes_equal_each_sets_own_match(seed: int, n_sets: int) -> None:
    """One call for every rank's match of a prompt: the C function and its Python twin give each
    set's own match, for the sets that hold the prompt's head only."""
    rng = random.Random(seed)
    chains = _chains(rng, 12, 10, [])
    sets = tuple(LruSet() for _ in range(n_sets))
    names = tuple(("inst", i) for i in range(n_sets))
    for s in sets:
        for _ in range(rng.randint(0, 8)):
            chain = rng.choice(chains)
            s.store(chain, s.match(chain), rng.randint(3, 30))
    for chain in [*chains, []]:
        want = {name: s.match(chain) for s, name in zip(sets, names, strict=True) if s.match(chain)}
        assert prefixes(sets, names, chain) == want
        assert py_prefixes(sets, names, tuple(chain)) == want
    with pytest.raises(ValueError, match="names"):
        prefixes(sets, names[:-1], chains[0])
    with pytest.raises(TypeError, match="LruSet"):
        prefixes((PyLruSet(),), ("x",), chains[0])
