/* An LRU-ordered set of 64-bit integer keys: the simulator's per-rank HBM prefix cache (sim/lru_set.py).
 *
 * Same behaviour as sim/lru_set.py's PyLruSet (an OrderedDict of keys), which the tests hold it to; a
 * compact table instead of the dict's entries, linked nodes and int objects (~24 bytes a key, not ~120),
 * so a rack's hundred thousand keys per rank stay closer to the CPU's caches, and a chain's store,
 * touch and eviction run as one call.
 *
 * Layout: entries in one array (key, sign flag, previous and next entry in LRU order: a doubly linked
 * list from least to most recent), freed entries reused; an open-addressing index of entry numbers
 * (linear probing, deletion by backward shift, so no tombstones), at most half full.
 * Keys are Python ints in [-2**63, 2**64): stored as their 64 bits plus a flag for negative ones. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../splitmix.h"

#define NIL (-1)

/* a hint to start loading a cache line that will be read soon: the tables of a rack's ranks do not
   fit the CPU's caches, so independent lookups are issued ahead and their misses overlap */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif
#define AHEAD 8  /* keys looked ahead by a store's insert loop */

typedef struct {
    uint64_t key;
    int32_t prev, next;
    uint8_t neg;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;
    int32_t cap;      /* entries allocated */
    int32_t used;     /* entries handed out at least once (high-water mark) */
    int32_t free;     /* head of the free list (through next), NIL if none */
    int32_t head, tail;  /* least and most recent */
    Py_ssize_t size;
    int32_t *index;   /* slot -> entry, NIL when empty */
    uint64_t mask;    /* slots - 1 */
} LruSet;

#define mix splitmix64  /* the index's hash: small sequential keys spread too */

/* A Python int as (bits, negative); -1 with an exception set when it is not one of the range. */
static inline int to_key(PyObject *o, uint64_t *k, uint8_t *neg) {
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "LruSet keys must be ints, got %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
        if (v == -1 && PyErr_Occurred()) return -1;
        *k = (uint64_t)v;
        *neg = v < 0;
        return 0;
    }
    if (overflow < 0) {
        PyErr_SetString(PyExc_OverflowError, "LruSet keys must be in [-2**63, 2**64)");
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *k = (uint64_t)u;
    *neg = 0;
    return 0;
}

static inline PyObject *from_key(const Entry *e) {
    return e->neg ? PyLong_FromLongLong((long long)e->key) : PyLong_FromUnsignedLongLong(e->key);
}

/* slot holding the key, or the empty slot where it would go; *found tells which */
static inline uint64_t probe(const LruSet *s, uint64_t k, uint8_t neg, int *found) {
    uint64_t i = mix(k ^ neg) & s->mask;
    for (;;) {
        int32_t e = s->index[i];
        if (e == NIL) {
            *found = 0;
            return i;
        }
        if (s->entries[e].key == k && s->entries[e].neg == neg) {
            *found = 1;
            return i;
        }
        i = (i + 1) & s->mask;
    }
}

static int grow_index(LruSet *s) {
    uint64_t slots = (s->mask + 1) * 2;
    int32_t *index = PyMem_Malloc(slots * sizeof(int32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(index, 0xff, slots * sizeof(int32_t));
    uint64_t mask = slots - 1;
    for (int32_t e = s->head; e != NIL; e = s->entries[e].next) {
        uint64_t i = mix(s->entries[e].key ^ s->entries[e].neg) & mask;
        while (index[i] != NIL) i = (i + 1) & mask;
        index[i] = e;
    }
    PyMem_Free(s->index);
    s->index = index;
    s->mask = mask;
    return 0;
}

static inline void unlink_entry(LruSet *s, int32_t e) {
    Entry *x = &s->entries[e];
    if (x->prev != NIL) s->entries[x->prev].next = x->next; else s->head = x->next;
    if (x->next != NIL) s->entries[x->next].prev = x->prev; else s->tail = x->prev;
}

static inline void append_entry(LruSet *s, int32_t e) {
    Entry *x = &s->entries[e];
    x->prev = s->tail;
    x->next = NIL;
    if (s->tail != NIL) s->entries[s->tail].next = e; else s->head = e;
    s->tail = e;
}

/* move the run first..last (consecutive in LRU order) to the most recent end, keeping its order: the
   same list as moving each of its entries to the end in turn */
static inline void splice_to_tail(LruSet *s, int32_t first, int32_t last) {
    if (last == s->tail) return;
    Entry *x = s->entries;
    int32_t before = x[first].prev, after = x[last].next;
    if (before != NIL) x[before].next = after; else s->head = after;
    x[after].prev = before;
    x[s->tail].next = first;
    x[first].prev = s->tail;
    x[last].next = NIL;
    s->tail = last;
}

/* insert an absent key at the most recent end (slot from probe) */
static int insert_at(LruSet *s, uint64_t slot, uint64_t k, uint8_t neg) {
    int32_t e;
    if (s->free != NIL) {
        e = s->free;
        s->free = s->entries[e].next;
    } else {
        if (s->used == s->cap) {
            if (s->cap >= INT32_MAX / 2) {
                PyErr_SetString(PyExc_OverflowError, "LruSet is full");
                return -1;
            }
            int32_t cap = s->cap ? s->cap * 2 : 64;
            Entry *grown = PyMem_Realloc(s->entries, (size_t)cap * sizeof(Entry));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            s->entries = grown;
            s->cap = cap;
        }
        e = s->used++;
    }
    s->entries[e].key = k;
    s->entries[e].neg = neg;
    append_entry(s, e);
    s->index[slot] = e;
    s->size++;
    if ((uint64_t)s->size * 2 > s->mask + 1) return grow_index(s);
    return 0;
}

/* delete the index slot (backward shift keeps every probe run unbroken) and free its entry */
static void delete_slot(LruSet *s, uint64_t i) {
    int32_t e = s->index[i];
    unlink_entry(s, e);
    s->entries[e].next = s->free;
    s->free = e;
    s->size--;
    uint64_t mask = s->mask;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        int32_t f = s->index[j];
        if (f == NIL) break;
        uint64_t home = mix(s->entries[f].key ^ s->entries[f].neg) & mask;
        /* f may move to i when i lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->index[i] = f;
            i = j;
        }
    }
    s->index[i] = NIL;
}

static int contains_obj(LruSet *s, PyObject *o) {
    uint64_t k;
    uint8_t neg;
    if (!PyLong_Check(o)) return 0;
    if (to_key(o, &k, &neg) < 0) {
        PyErr_Clear();
        return 0;  /* out of range: never held */
    }
    int found;
    probe(s, k, neg, &found);
    return found;
}

/* ---- the Python type ---------------------------------------------------------------------------- */

static PyObject *LruSet_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    LruSet *s = (LruSet *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->entries = NULL;
    s->cap = s->used = 0;
    s->free = s->head = s->tail = NIL;
    s->size = 0;
    s->mask = 63;
    s->index = PyMem_Malloc(64 * sizeof(int32_t));
    if (s->index == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    memset(s->index, 0xff, 64 * sizeof(int32_t));
    return (PyObject *)s;
}

static int LruSet_init(LruSet *s, PyObject *args, PyObject *kw) {
    static char *names[] = {NULL};
    return PyArg_ParseTupleAndKeywords(args, kw, "", names) ? 0 : -1;
}

static void LruSet_dealloc(LruSet *s) {
    PyMem_Free(s->entries);
    PyMem_Free(s->index);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t LruSet_len(LruSet *s) { return s->size; }

static int LruSet_contains(LruSet *s, PyObject *o) { return contains_obj(s, o); }

static PyObject *LruSet_keys(LruSet *s, PyObject *unused) {
    PyObject *out = PyList_New(s->size);
    if (out == NULL) return NULL;
    Py_ssize_t n = 0;
    for (int32_t e = s->head; e != NIL; e = s->entries[e].next) {
        PyObject *v = from_key(&s->entries[e]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n++, v);
    }
    return out;
}

static PyObject *LruSet_iter(LruSet *s) {
    PyObject *keys = LruSet_keys(s, NULL);
    if (keys == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

/* fast sequence access: a tuple or list as an array of objects */
#define SEQ_FAST(obj, name) PySequence_Fast((obj), name " must be a sequence")

/* leading items held, by bisection (the same as PyLruSet.match) */
static Py_ssize_t match_items(LruSet *s, PyObject **items, Py_ssize_t hi) {
    if (hi == 0 || !contains_obj(s, items[0])) return 0;
    if (contains_obj(s, items[hi - 1])) return hi;
    Py_ssize_t lo = 1;  /* invariant: items[lo-1] held, items[hi] not */
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (contains_obj(s, items[mid])) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static PyObject *LruSet_match(LruSet *s, PyObject *arg) {
    PyObject *seq = SEQ_FAST(arg, "hashes");
    if (seq == NULL) return NULL;
    Py_ssize_t lo = match_items(s, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    return PyLong_FromSsize_t(lo);
}

static PyObject *LruSet_store(LruSet *s, PyObject *args) {
    PyObject *arg;
    Py_ssize_t held, capacity;
    if (!PyArg_ParseTuple(args, "Onn:store", &arg, &held, &capacity)) return NULL;
    PyObject *seq = SEQ_FAST(arg, "hashes");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (held < 0 || held > n) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "held: must be in [0, %zd], got %zd", n, held);
    }
    /* the keys past the held prefix, last first (an existing one keeps its place, as dict.update);
       converted first, so each key's index slot is fetched AHEAD keys before it is probed */
    Py_ssize_t fresh = n - held;
    uint64_t *keys = NULL;
    uint8_t *negs = NULL;
    if (fresh > 0) {
        keys = PyMem_Malloc((size_t)fresh * sizeof(uint64_t));
        negs = PyMem_Malloc((size_t)fresh);
        if (keys == NULL || negs == NULL) {
            PyMem_Free(keys);
            PyMem_Free(negs);
            PyErr_NoMemory();
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < fresh; i++) {  /* keys[i] is items[n - 1 - i] */
        if (to_key(items[n - 1 - i], &keys[i], &negs[i]) < 0) {
            PyMem_Free(keys);
            PyMem_Free(negs);
            goto fail;
        }
        if (i < AHEAD) PREFETCH(&s->index[mix(keys[i] ^ negs[i]) & s->mask]);
    }
    for (Py_ssize_t i = 0; i < fresh; i++) {
        if (i + AHEAD < fresh) PREFETCH(&s->index[mix(keys[i + AHEAD] ^ negs[i + AHEAD]) & s->mask]);
        int found;
        uint64_t slot = probe(s, keys[i], negs[i], &found);
        if (!found && insert_at(s, slot, keys[i], negs[i]) < 0) {
            PyMem_Free(keys);
            PyMem_Free(negs);
            goto fail;
        }
    }
    PyMem_Free(keys);
    PyMem_Free(negs);
    /* then the held prefix touched, last first: the chain's head ends most recent. Touched keys that
       already follow one another in LRU order (a chain stored before, as it was stored) move as one
       run: found by walking the list from the run's first key, with no index probe per key */
    Py_ssize_t i = held - 1;
    while (i >= 0) {
        uint64_t k;
        uint8_t neg;
        int found;
        if (to_key(items[i], &k, &neg) < 0) goto fail;
        uint64_t slot = probe(s, k, neg, &found);
        if (!found) {
            PyErr_SetObject(PyExc_KeyError, items[i]);
            goto fail;
        }
        int32_t first = s->index[slot], last = first;
        Py_ssize_t j = i;
        while (j > 0) {
            int32_t nx = s->entries[last].next;
            if (nx == NIL || to_key(items[j - 1], &k, &neg) < 0) {
                PyErr_Clear();  /* a bad key ends the run; its own probe raises */
                break;
            }
            if (s->entries[nx].key != k || s->entries[nx].neg != neg) break;
            last = nx;
            j--;
        }
        splice_to_tail(s, first, last);
        i = j - 1;
    }
    Py_DECREF(seq);
    Py_ssize_t excess = s->size - capacity;
    if (excess <= 0) return PyTuple_New(0);
    PyObject *gone = PyTuple_New(excess);
    if (gone == NULL) return NULL;
    /* least recent first: the victims read off the list (their index slots fetched meanwhile), then
       the entries in the slots after theirs (a deletion's backward shift reads them), then deleted */
    int32_t e = s->head;
    for (Py_ssize_t j = 0; j < excess; j++, e = s->entries[e].next) {
        Entry *x = &s->entries[e];
        PREFETCH(&s->index[mix(x->key ^ x->neg) & s->mask]);
        PyObject *v = from_key(x);
        if (v == NULL) {  /* nothing deleted yet */
            Py_DECREF(gone);
            return NULL;
        }
        PyTuple_SET_ITEM(gone, j, v);
    }
    e = s->head;
    for (Py_ssize_t j = 0; j < excess; j++, e = s->entries[e].next) {
        Entry *x = &s->entries[e];
        int32_t f = s->index[(mix(x->key ^ x->neg) + 1) & s->mask];
        if (f != NIL) PREFETCH(&s->entries[f]);
    }
    for (Py_ssize_t j = 0; j < excess; j++) {
        Entry *x = &s->entries[s->head];
        int found;
        uint64_t slot = probe(s, x->key, x->neg, &found);
        delete_slot(s, slot);
    }
    return gone;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *LruSet_among(LruSet *s, PyObject *arg) {
    PyObject *seq = SEQ_FAST(arg, "keys");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PySet_New(NULL);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (contains_obj(s, items[i]) && PySet_Add(out, items[i]) < 0) {
            Py_CLEAR(out);
            break;
        }
    }
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef LruSet_methods[] = {
    {"match", (PyCFunction)LruSet_match, METH_O,
     "match(hashes) -> leading keys held, by bisection (the set holds prefixes of chains)"},
    {"store", (PyCFunction)LruSet_store, METH_VARARGS,
     "store(hashes, held, capacity) -> keys evicted, least recent first: the keys past the held "
     "prefix added last first, the held prefix touched last first, then the least recent evicted "
     "down to capacity"},
    {"among", (PyCFunction)LruSet_among, METH_O, "among(keys) -> set of those held"},
    {"keys", (PyCFunction)LruSet_keys, METH_NOARGS, "keys() -> list, least recent first"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods LruSet_as_sequence = {
    .sq_length = (lenfunc)LruSet_len,
    .sq_contains = (objobjproc)LruSet_contains,
};

static PyTypeObject LruSetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rackserve.sim._lruset.LruSet",
    .tp_basicsize = sizeof(LruSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An LRU-ordered set of 64-bit integer keys (see rackserve/sim/lru_set.py).",
    .tp_new = LruSet_new,
    .tp_init = (initproc)LruSet_init,
    .tp_dealloc = (destructor)LruSet_dealloc,
    .tp_as_sequence = &LruSet_as_sequence,
    .tp_iter = (getiterfunc)LruSet_iter,
    .tp_methods = LruSet_methods,
};

/* prefixes(sets, names, hashes) -> {names[i]: sets[i].match(hashes)} for the sets whose match is not 0 */
static PyObject *prefixes(PyObject *module, PyObject *args) {
    PyObject *sets, *names, *arg;
    if (!PyArg_ParseTuple(args, "O!O!O:prefixes", &PyTuple_Type, &sets, &PyTuple_Type, &names, &arg)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(sets);
    if (PyTuple_GET_SIZE(names) != n) return PyErr_Format(PyExc_ValueError, "prefixes: %zd sets, %zd names", n,
                                                          PyTuple_GET_SIZE(names));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(sets, i), &LruSetType))
            return PyErr_Format(PyExc_TypeError, "prefixes: sets[%zd] is not an LruSet", i);
    }
    PyObject *seq = SEQ_FAST(arg, "hashes");
    if (seq == NULL) return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyDict_New();
    if (out == NULL || len == 0) goto done;
    /* every set's first probe (the prompt's first key; most sets lack it) fetched at once: the slots,
       then their entries, so the sets' cache misses overlap instead of queuing one set at a time */
    uint64_t k0;
    uint8_t neg0;
    if (PyLong_Check(items[0]) && to_key(items[0], &k0, &neg0) == 0) {
        uint64_t h = mix(k0 ^ neg0);
        for (Py_ssize_t i = 0; i < n; i++) {
            LruSet *s = (LruSet *)PyTuple_GET_ITEM(sets, i);
            PREFETCH(&s->index[h & s->mask]);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            LruSet *s = (LruSet *)PyTuple_GET_ITEM(sets, i);
            int32_t e = s->index[h & s->mask];
            if (e != NIL) PREFETCH(&s->entries[e]);
        }
    } else {
        PyErr_Clear();  /* not a key any set holds: match_items finds that again */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = match_items((LruSet *)PyTuple_GET_ITEM(sets, i), items, len);
        if (m == 0) continue;
        PyObject *v = PyLong_FromSsize_t(m);
        if (v == NULL || PyDict_SetItem(out, PyTuple_GET_ITEM(names, i), v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(v);
    }
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef module_methods[] = {
    {"prefixes", prefixes, METH_VARARGS,
     "prefixes(sets, names, hashes) -> {names[i]: sets[i].match(hashes)} where that is not 0"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lruset", "An LRU-ordered set of 64-bit integer keys, in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__lruset(void) {
    if (PyType_Ready(&LruSetType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LruSetType);
    if (PyModule_AddObject(m, "LruSet", (PyObject *)&LruSetType) < 0) {
        Py_DECREF(&LruSetType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
