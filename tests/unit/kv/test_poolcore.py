"""The pool's stored-block record in C (kv/_poolcore.c) against the dataclass it stands for
(pool_chains.PyStoredBlock): the same fields, mutability, equality, hashing, repr and pickling, and the
pool's child link outside equality and repr."""

import pickle
import shutil

import pytest

from rackserve.kv.pool_chains import PyStoredBlock, StoredBlock

needs_c = pytest.mark.skipif(StoredBlock is PyStoredBlock, reason="kv/_poolcore.c is not built (no C compiler)")
FIELDS = ("block_hash", "size", "charge", "owner", "tier", "parent_hash")
ARGS = (2**64 - 1, 4096, 65536, "p0/1", "pool_hbm", None)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_c_record_is_built_where_a_compiler_is():
    assert StoredBlock is not PyStoredBlock, "rackserve/kv/_poolcore.c was not built: run `make venv`"


@needs_c
def test_the_c_record_behaves_as_the_dataclass():
    c, py = StoredBlock(*ARGS), PyStoredBlock(*ARGS)
    assert tuple(getattr(c, f) for f in FIELDS) == tuple(getattr(py, f) for f in FIELDS) == ARGS
    assert StoredBlock(**dict(zip(FIELDS, ARGS, strict=True))) == c  # keywords too
    assert repr(c) == repr(py).replace("PyStoredBlock", "StoredBlock", 1)
    for i, name in enumerate(FIELDS):  # equal only field by field, as the dataclass compares
        other = list(ARGS)
        other[i] = 7 if name != "owner" else "p1/0"
        for cls, one in ((StoredBlock, c), (PyStoredBlock, py)):
            assert one == cls(*ARGS) and not one != cls(*ARGS)
            assert one != cls(*other) and not one == cls(*other)
    assert c != py and py != c  # another class: never equal (NotImplemented both ways)
    assert (c == ARGS) is False
    for one in (c, py):
        with pytest.raises(TypeError):
            hash(one)  # mutable dataclass: unhashable
        with pytest.raises(AttributeError):
            one.extra = 1  # no new attributes (slots)
    c.tier = py.tier = "pool_dram"  # a move changes the tier in place
    assert c.tier == "pool_dram" and repr(c) == repr(py).replace("PyStoredBlock", "StoredBlock", 1)
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back is not c and type(back) is StoredBlock
    with pytest.raises(AttributeError, match="deleted"):
        del c.tier
    assert c.tier == "pool_dram"


@needs_c
def test_the_child_link_is_kept_but_neither_compared_nor_shown():
    """`child` (the pool's link to one stored child) as the dataclass has it: None unless given, set in
    place, pickled, and outside equality and repr (two records of one block are equal whatever links)."""
    for cls in (StoredBlock, PyStoredBlock):
        one, two = cls(*ARGS), cls(*ARGS, child=12)
        assert one.child is None and two.child == 12 and cls(*ARGS, 13).child == 13
        assert one == two and repr(one) == repr(two) and "child" not in repr(two)
        one.child = 2**64 - 2
        back = pickle.loads(pickle.dumps(one))
        assert back.child == 2**64 - 2 and back == one


@needs_c
def test_the_c_record_names_bad_arguments():
    with pytest.raises(TypeError):
        StoredBlock(*ARGS[:5])  # a field missing
    with pytest.raises(TypeError):
        StoredBlock(*ARGS, 1, 2)  # one too many (the seventh is `child`)
    with pytest.raises(TypeError):
        StoredBlock(*ARGS[:5], parent=None)  # not a field


@needs_c
def test_the_c_leading_run_probes_as_the_python_one():
    """leading_run against py_leading_run: chains whose held keys are a prefix (one table, or split
    over two as pending and stored are), any `hi`, dicts, OrderedDicts and sets; the same probes in the
    same order (a table that records what it is asked)."""
    import random
    from collections import OrderedDict

    from rackserve.kv.pool_chains import leading_run, py_leading_run

    class Asked(dict):
        def __init__(self, keys, log):
            super().__init__(dict.fromkeys(keys))
            self.log = log

        def __contains__(self, key):
            self.log.append(key)
            return super().__contains__(key)

    rng = random.Random(11)
    for _ in range(500):
        chain = [rng.getrandbits(64) - (1 << 63) * rng.randrange(2) for _ in range(rng.randrange(0, 60))]
        held = rng.randrange(0, len(chain) + 1)
        cut = rng.randrange(0, held + 1)  # keys [0, cut) in the first table, [cut, held) in the second
        hi = rng.randrange(0, len(chain) + 1)
        tables = (dict.fromkeys(chain[:cut]), OrderedDict.fromkeys(chain[cut:held]), set())
        assert leading_run(chain, hi, *tables) == py_leading_run(chain, hi, *tables) == min(held, hi)
        assert leading_run(tuple(chain), hi, tables[0]) == min(cut, hi)
        logs = ([], [])
        a = leading_run(chain, hi, Asked(chain[:held], logs[0]))
        b = py_leading_run(chain, hi, Asked(chain[:held], logs[1]))
        assert a == b and logs[0] == logs[1]
    with pytest.raises(ValueError, match="hi"):
        leading_run([1, 2], 3, {})
    with pytest.raises(TypeError):
        leading_run([1, 2], 2)  # no table
    with pytest.raises(TypeError):
        leading_run(5, 0, {})  # not a sequence
