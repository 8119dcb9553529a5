/* The pool's compiled parts (kv/pool_chains.py): its stored-block record as a C type, and the bisection that
 * finds a chain's leading run in the pool's tables.
 *
 * StoredBlock:
 * Same fields, order, mutability, equality and repr as the dataclass it stands for (pool_chains.py keeps
 * that as `PyStoredBlock`, the reference its tests hold this to). A rack point holds millions of these:
 * made by a plain C constructor (no Python __init__ frame: ~2x faster, 84 against 167 ns) and 16 bytes smaller, with no
 * garbage-collector header, since its fields hold ints, strings and None only (no reference cycles can
 * go through it; assigning a container to a field is not supported). `child` is the pool's link to one of
 * the block's stored children (pool_chains.py: the others, where a chain forks, in a table of their own):
 * on the parent's record, not in a table of millions keyed by the parent's hash. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NFIELDS 6

typedef struct {
    PyObject_HEAD
    PyObject *f[NFIELDS]; /* block_hash, size, charge, owner, tier, parent_hash */
    PyObject *child;      /* the pool's link to one stored child (None: none); not compared, not shown */
} Record;

static const char *names[NFIELDS + 2] = {"block_hash", "size", "charge", "owner", "tier", "parent_hash", "child",
                                         NULL};

static PyTypeObject RecordType;

static PyObject *Record_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *v[NFIELDS] = {NULL};
    PyObject *child = Py_None;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (kw == NULL && n == NFIELDS) { /* the hot path: positional, as the pool makes them */
        for (int i = 0; i < NFIELDS; i++) v[i] = PyTuple_GET_ITEM(args, i);
    } else if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|O:StoredBlock", (char **)names, &v[0], &v[1], &v[2],
                                            &v[3], &v[4], &v[5], &child)) {
        return NULL;
    }
    Record *r = (Record *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    for (int i = 0; i < NFIELDS; i++) r->f[i] = Py_NewRef(v[i]);
    r->child = Py_NewRef(child);
    return (PyObject *)r;
}

static void Record_dealloc(Record *r) {
    for (int i = 0; i < NFIELDS; i++) Py_CLEAR(r->f[i]);
    Py_CLEAR(r->child);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* as the dataclass: equal when the other is of the same class and every compared field is equal, in order */
static PyObject *Record_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(b) != Py_TYPE(a)) Py_RETURN_NOTIMPLEMENTED;
    Record *x = (Record *)a, *y = (Record *)b;
    for (int i = 0; i < NFIELDS; i++) {
        int eq = PyObject_RichCompareBool(x->f[i], y->f[i], Py_EQ);
        if (eq < 0) return NULL;
        if (!eq) return PyBool_FromLong(op == Py_NE);
    }
    return PyBool_FromLong(op == Py_EQ);
}

static PyObject *Record_repr(Record *r) {
    return PyUnicode_FromFormat("StoredBlock(block_hash=%R, size=%R, charge=%R, owner=%R, tier=%R, parent_hash=%R)",
                                r->f[0], r->f[1], r->f[2], r->f[3], r->f[4], r->f[5]);
}

static PyObject *Record_reduce(Record *r, PyObject *unused) {  /* pickles as its constructor call */
    return Py_BuildValue("(O(OOOOOOO))", Py_TYPE(r), r->f[0], r->f[1], r->f[2], r->f[3], r->f[4], r->f[5], r->child);
}

static PyMethodDef Record_methods[] = {
    {"__reduce__", (PyCFunction)Record_reduce, METH_NOARGS, "pickle support"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Record_members[] = {
    {"block_hash", T_OBJECT, offsetof(Record, f) + 0 * sizeof(PyObject *), 0, "the block's hash"},
    {"size", T_OBJECT, offsetof(Record, f) + 1 * sizeof(PyObject *), 0, "actual bytes in Redis"},
    {"charge", T_OBJECT, offsetof(Record, f) + 2 * sizeof(PyObject *), 0, "target bytes counted against the tier"},
    {"owner", T_OBJECT, offsetof(Record, f) + 3 * sizeof(PyObject *), 0, "who put it"},
    {"tier", T_OBJECT, offsetof(Record, f) + 4 * sizeof(PyObject *), 0, "the tier it is in"},
    {"parent_hash", T_OBJECT, offsetof(Record, f) + 5 * sizeof(PyObject *), 0,
     "the block before it in its chain (None: a chain's root)"},
    {"child", T_OBJECT, offsetof(Record, child), 0, "one stored child's hash, the pool's link (None: none)"},
    {NULL},
};

static int Record_setattro(PyObject *o, PyObject *name, PyObject *value) {
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "StoredBlock fields cannot be deleted (%U)", name);
        return -1;
    }
    return PyObject_GenericSetAttr(o, name, value);
}

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rackserve.kv._poolcore.StoredBlock",
    .tp_basicsize = sizeof(Record),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StoredBlock(block_hash, size, charge, owner, tier, parent_hash, child=None): a block the pool stores",
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_richcompare = Record_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_repr = (reprfunc)Record_repr,
    .tp_members = Record_members,
    .tp_methods = Record_methods,
    .tp_setattro = Record_setattro,
};

/* leading_run(hashes, hi, *tables): the length of the leading run of hashes[:hi] that are in any of the
   tables, by bisection (the caller knows the run is leading: the tables hold prefixes of chains); the same
   probes, in the same order, as pool_chains.py_leading_run (its reference), without a bytecode
   loop around them */
static PyObject *leading_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3) return PyErr_Format(PyExc_TypeError, "leading_run(hashes, hi, *tables): %zd arguments", nargs);
    PyObject *seq = PySequence_Fast(args[0], "leading_run: hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t hi = PyLong_AsSsize_t(args[1]);
    if (hi == -1 && PyErr_Occurred()) goto fail;
    if (hi < 0 || hi > PySequence_Fast_GET_SIZE(seq)) {
        PyErr_Format(PyExc_ValueError, "leading_run: hi must be in [0, %zd], got %zd", PySequence_Fast_GET_SIZE(seq), hi);
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t lo = 0;
    if (hi > 0) {  /* the first key alone first: most chains asked about are held nowhere (one probe, not log n) */
        int held = 0;
        for (Py_ssize_t t = 2; t < nargs && !held; t++) {
            held = PySequence_Contains(args[t], items[0]);
            if (held < 0) goto fail;
        }
        if (!held) hi = 0; else lo = 1;
    }
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        int held = 0;
        for (Py_ssize_t t = 2; t < nargs && !held; t++) {
            held = PySequence_Contains(args[t], items[mid]);
            if (held < 0) goto fail;
        }
        if (held) lo = mid + 1; else hi = mid;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(lo);
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"leading_run", (PyCFunction)(void (*)(void))leading_run, METH_FASTCALL,
     "leading_run(hashes, hi, *tables) -> leading keys of hashes[:hi] in any table, by bisection"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_poolcore", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__poolcore(void) {
    if (PyType_Ready(&RecordType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "StoredBlock", (PyObject *)&RecordType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
