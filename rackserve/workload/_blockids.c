/* A replayed request's block ids in one pass (workload/trace_blocks.py next_block_ids, scale 1).
 *
 * Same arithmetic as the numpy reference in trace_blocks.py (`_mix` over `_content`), element by element:
 * block j covers trace block last = ((j + 1) * block_tokens - 1) // 64; its content is that trace block's
 * id, or the request's own `tail | 2**63` past the trace's last block; its id is splitmix64's finalizer of
 * content * ID + j * POS + salt, all modulo 2**64. The leading `keep` ids are copied from the previous
 * request's. One call instead of ~20 small numpy operations per request (~45 us at the rack point). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../splitmix.h"

#define TRACE_BLOCK_TOKENS 64
#define ID_MUL 0x9E3779B97F4A7C15ULL
#define POS_MUL 0xD6E8FEB86659FD93ULL
#define TAIL_BIT (1ULL << 63)

/* fill(out, prev, keep, hash_ids, salt, tail, block_tokens): out[:keep] = prev[:keep], out[j] for the rest */
static PyObject *fill(PyObject *module, PyObject *args) {
    Py_buffer out, prev, ids;
    Py_ssize_t keep, block_tokens;
    unsigned long long salt, tail;
    if (!PyArg_ParseTuple(args, "w*y*ny*KKn:fill", &out, &prev, &keep, &ids, &salt, &tail, &block_tokens))
        return NULL;
    PyObject *result = NULL;
    if (out.itemsize != 8 || out.len % 8 || prev.len % 8 || ids.len % 8) {
        PyErr_SetString(PyExc_ValueError, "fill: out, prev and hash_ids must be arrays of 8-byte integers");
        goto done;
    }
    Py_ssize_t count = out.len / 8, n_prev = prev.len / 8, n = ids.len / 8;
    if (keep < 0 || keep > count || keep > n_prev) {
        PyErr_Format(PyExc_ValueError, "fill: keep must be in [0, min(%zd, %zd)], got %zd", count, n_prev, keep);
        goto done;
    }
    if (block_tokens <= 0) {
        PyErr_Format(PyExc_ValueError, "fill: block_tokens must be positive, got %zd", block_tokens);
        goto done;
    }
    uint64_t *o = (uint64_t *)out.buf;
    const uint64_t *h = (const uint64_t *)ids.buf;
    if (keep) memcpy(o, prev.buf, (size_t)keep * 8);
    uint64_t own = (uint64_t)tail | TAIL_BIT;
    for (Py_ssize_t j = keep; j < count; j++) {
        Py_ssize_t last = block_tokens == TRACE_BLOCK_TOKENS ? j : ((j + 1) * block_tokens - 1) / TRACE_BLOCK_TOKENS;
        uint64_t content = last < n ? h[last] : own;
        o[j] = splitmix64(content * ID_MUL + (uint64_t)j * POS_MUL + (uint64_t)salt);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&prev);
    PyBuffer_Release(&ids);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS,
     "fill(out, prev, keep, hash_ids, salt, tail, block_tokens): a request's block ids into out (uint64)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_blockids", NULL, -1, methods};

PyMODINIT_FUNC PyInit__blockids(void) { return PyModule_Create(&module); }
