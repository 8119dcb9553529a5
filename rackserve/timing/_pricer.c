/* The step pricer's arithmetic in one call each (timing/pricer.py): a layer group's per-rank context
 * features, their attention/indexer roofline times, a single-token decode step's per-rank times, a
 * prefill rank's row and a layer group's token bundle (timing/bundle_plan.py). The numpy twins (plan_features.py, step_plan.py) are the reference; this file
 * does their operations element by element in the same order (built with -ffp-contract=off, so no
 * fused multiply-add), and np.add.reduceat's segment sums as numpy does them (the first element plus
 * the pairwise sum of the rest). Only the small matrix products (BLAS in numpy) sum in a plain order:
 * the results agree with the twins to rounding (tests/unit/timing/test_pricer.py holds them to 1e-12).
 *
 * Arrays come as buffers (numpy arrays, C-contiguous): float64 unless named otherwise; outputs are
 * written in place. One call replaces 10-30 small numpy operations (~1-3 us each). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* numpy's DOUBLE_pairwise_sum (numpy/_core/src/umath/loops_utils.h.src), contiguous */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* np.add.reduceat(row, starts)[i] over a row of `len` values */
static double segment_sum(const double *row, Py_ssize_t len, const Py_ssize_t *starts, Py_ssize_t nseg, Py_ssize_t i) {
    Py_ssize_t s = starts[i], e = i + 1 < nseg ? starts[i + 1] : len;
    if (s >= e) return row[s];
    return row[s] + pairwise_sum(row + s + 1, e - s - 1);
}

static inline double np_max(double a, double b) { return a >= b ? a : (a < b ? b : a + b); }
static inline double np_min(double a, double b) { return a <= b ? a : (a > b ? b : a + b); }

/* GroupPlan's packed feature constants (plan.py _packed): nidx, window, knee[2+I], div[1+I], cap[1+I],
 * ratio[I], top_k[I], order[7+2I] */
typedef struct {
    Py_ssize_t nidx, nrows;
    double window;
    const double *knee, *div, *cap, *ratio, *top_k, *order;
} FeatureConsts;

static int unpack(const Py_buffer *b, FeatureConsts *fc) {
    const double *c = (const double *)b->buf;
    Py_ssize_t len = b->len / 8;
    if (len < 2) goto bad;
    fc->nidx = (Py_ssize_t)c[0];
    fc->window = c[1];
    Py_ssize_t I = fc->nidx;
    fc->nrows = 7 + 2 * I;
    if (I < 0 || len != 2 + (2 + I) + 2 * (1 + I) + 2 * I + fc->nrows) goto bad;
    fc->knee = c + 2;
    fc->div = fc->knee + 2 + I;
    fc->cap = fc->div + 1 + I;
    fc->ratio = fc->cap + 1 + I;
    fc->top_k = fc->ratio + I;
    fc->order = fc->top_k + I;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "features: packed constants of the wrong length");
    return -1;
}

/* _general_features' rows [7 + 2I, n + 1] (row stride n + 1) of queries q ending at end; column n zero */
static void feature_rows(double *rows, const FeatureConsts *fc, const double *q, const double *end, Py_ssize_t n) {
    Py_ssize_t I = fc->nidx, c = 2 + I, w = n + 1;
    for (Py_ssize_t j = 0; j < n; j++) {
        double e = end[j], qj = q[j];
        double lo = e - qj, lo2 = lo * (lo + 1.0);
        for (Py_ssize_t r = 0; r < c; r++) {
            double knee = np_min(np_max(lo, fc->knee[r]), e);
            double v = (knee * (knee + 1.0) - lo2) * 0.5;
            if (r) v = v / fc->div[r - 1] + (e - knee) * fc->cap[r - 1];
            rows[r * w + j] = v;
        }
        rows[c * w + j] = e * ceil(qj / 128.0);
        double some = qj > 0 ? 1.0 : 0.0;
        rows[(c + 1) * w + j] = (fc->window ? np_min(e, fc->window + qj - 1.0) : 0.0) * some;
        rows[(c + 2) * w + j] = e * some;
        for (Py_ssize_t i = 0; i < I; i++) rows[(c + 3 + i) * w + j] = np_min(e / fc->ratio[i], fc->top_k[i]) * some;
        rows[(fc->nrows - 2) * w + j] = qj;
        rows[(fc->nrows - 1) * w + j] = some;
    }
    for (Py_ssize_t r = 0; r < fc->nrows; r++) rows[r * w + n] = 0.0;
}

static int check(const Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
    if (b->len != itemsize * count) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd", what, b->len, itemsize * count);
        return -1;
    }
    return 0;
}

/* features(out, q, end, starts, nonempty, zeros, consts): _general_features into out [7 + 2I, R] */
static PyObject *features(PyObject *module, PyObject *args) {
    Py_buffer out, q, end, starts, nonempty, consts;
    PyObject *zeros;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*Oy*:features", &out, &q, &end, &starts, &nonempty, &zeros, &consts))
        return NULL;
    PyObject *result = NULL, *zf = NULL;
    double *rows = NULL;
    FeatureConsts fc;
    if (unpack(&consts, &fc) < 0) goto done;
    Py_ssize_t n = q.len / 8, R = nonempty.len, w = n + 1;
    if (check(&end, 8, n, "end") || check(&starts, sizeof(Py_ssize_t), R, "starts")
        || check(&out, 8, fc.nrows * R, "out"))
        goto done;
    const Py_ssize_t *st = (const Py_ssize_t *)starts.buf;
    for (Py_ssize_t i = 0; i < R; i++)
        if (st[i] < 0 || st[i] > n) {
            PyErr_SetString(PyExc_ValueError, "features: a start out of range");
            goto done;
        }
    rows = (double *)malloc(sizeof(double) * (size_t)(fc.nrows * w));
    if (!rows) { PyErr_NoMemory(); goto done; }
    feature_rows(rows, &fc, (const double *)q.buf, (const double *)end.buf, n);
    if (zeros != Py_None) {
        zf = PySequence_Fast(zeros, "features: zeros must be a sequence of column indices");
        if (!zf) goto done;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(zf); k++) {
            Py_ssize_t col = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(zf, k));
            if (col == -1 && PyErr_Occurred()) goto done;
            if (col < 0 || col >= w) { PyErr_SetString(PyExc_ValueError, "features: a zero column out of range"); goto done; }
            for (Py_ssize_t r = 0; r < fc.nrows; r++) rows[r * w + col] = 0.0;
        }
    }
    const unsigned char *ne = (const unsigned char *)nonempty.buf;
    double *o = (double *)out.buf;
    for (Py_ssize_t k = 0; k < fc.nrows; k++) {
        const double *row = rows + (Py_ssize_t)fc.order[k] * w;
        for (Py_ssize_t i = 0; i < R; i++) o[k * R + i] = segment_sum(row, w, st, R, i) * (ne[i] ? 1.0 : 0.0);
    }
    result = Py_NewRef(Py_None);
done:
    free(rows);
    Py_XDECREF(zf);
    PyBuffer_Release(&out); PyBuffer_Release(&q); PyBuffer_Release(&end); PyBuffer_Release(&starts);
    PyBuffer_Release(&nonempty); PyBuffer_Release(&consts);
    return result;
}

/* The roofline of one rank from its compute and memory times x [4C] (tc = x[:2C], tm = x[2C:]):
 * (attention, indexer) times, then compute and memory totals, as _kv_times and Group.cm_row give them. */
static void rank_times(double *kv2, double *cm4, const double *x, Py_ssize_t C2, const double *omo, double overhead,
                       const double *gather, double seqs, const double *weights) {
    double t0 = 0, t1 = 0, c0 = 0, c1 = 0, m0 = 0, m1 = 0;
    for (Py_ssize_t j = 0; j < C2; j++) {
        double tc = x[j], tm = x[C2 + j];
        double t = np_max(tc, tm) + omo[j] * np_min(tc, tm) + overhead * (tm > 0 ? 1.0 : 0.0);
        if (gather) t = t + (seqs > 0 ? 1.0 : 0.0) * gather[j];
        t0 += t * weights[2 * j]; t1 += t * weights[2 * j + 1];
        c0 += tc * weights[2 * j]; c1 += tc * weights[2 * j + 1];
        m0 += tm * weights[2 * j]; m1 += tm * weights[2 * j + 1];
    }
    kv2[0] = t0; kv2[1] = t1;
    if (cm4) { cm4[0] = c0; cm4[1] = c1; cm4[2] = m0; cm4[3] = m1; }
}

/* x [4C] = f[:, col] (F rows of stride R) @ fmap [F, 4C] */
static void vecmat(double *x, const double *f, Py_ssize_t F, Py_ssize_t R, Py_ssize_t col, const double *fmap,
                   Py_ssize_t C4) {
    for (Py_ssize_t j = 0; j < C4; j++) x[j] = 0.0;
    for (Py_ssize_t k = 0; k < F; k++) {
        double v = f[k * R + col];
        const double *m = fmap + k * C4;
        for (Py_ssize_t j = 0; j < C4; j++) x[j] += v * m[j];
    }
}

static const double *optional(PyObject *obj, Py_buffer *b, int *held, Py_ssize_t count, const char *what) {
    *held = 0;
    if (obj == Py_None) return NULL;
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    *held = 1;
    if (check(b, 8, count, what) < 0) return NULL;
    return (const double *)b->buf;
}

/* kv_cm(kv, cm, f, fmap, omo, overhead, gather, weights): a layer group's per-rank (attention,
 * indexer) times kv [R, 2] and compute/memory totals cm [R, 4] from its features f [F + 2, R]
 * (_kv_times of f[:-2] with the seqs row f[-1]; gather None where the group has none) */
static PyObject *kv_cm(PyObject *module, PyObject *args) {
    Py_buffer kv, cm, f, fmap, omo, weights, gb;
    double overhead;
    PyObject *gather_obj;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*dOy*:kv_cm", &kv, &cm, &f, &fmap, &omo, &overhead, &gather_obj, &weights))
        return NULL;
    PyObject *result = NULL;
    int held = 0;
    double *x = NULL;
    Py_ssize_t R = kv.len / 16, C2 = omo.len / 8, C4 = 2 * C2;
    Py_ssize_t F = C4 ? fmap.len / 8 / C4 : 0;
    if (check(&cm, 8, 4 * R, "cm") || check(&f, 8, (F + 2) * R, "f") || check(&weights, 8, 2 * C2, "weights"))
        goto done;
    const double *gather = optional(gather_obj, &gb, &held, C2, "gather");
    if (PyErr_Occurred()) goto done;
    x = (double *)malloc(sizeof(double) * (size_t)(C4 ? C4 : 1));
    if (!x) { PyErr_NoMemory(); goto done; }
    const double *fd = (const double *)f.buf;
    for (Py_ssize_t r = 0; r < R; r++) {
        vecmat(x, fd, F, R, r, (const double *)fmap.buf, C4);
        rank_times((double *)kv.buf + 2 * r, (double *)cm.buf + 4 * r, x, C2, (const double *)omo.buf, overhead,
                   gather, fd[(F + 1) * R + r], (const double *)weights.buf);
    }
    result = Py_NewRef(Py_None);
done:
    free(x);
    if (held) PyBuffer_Release(&gb);
    PyBuffer_Release(&kv); PyBuffer_Release(&cm); PyBuffer_Release(&f); PyBuffer_Release(&fmap);
    PyBuffer_Release(&omo); PyBuffer_Release(&weights);
    return result;
}

/* decode_z(out, cached, k, starts, active, caps, dmap, d_omo, d_out): _decode_step's (and
 * decode_passes') per-rank totals z [k, R, 7] of single-token decode steps, one per row of cached
 * (int64 [k, n]): features sum(min(cached + 1, cap)) per rank (a zero column after the n sequences
 * where some rank is idle: `active`, bool [R], else None), x = feats.T @ dmap, then
 * [max(tc, tm), min(tc, tm) (where d_omo is not None), x] @ d_out. */
static PyObject *decode_z(PyObject *module, PyObject *args) {
    Py_buffer out, cached, starts, caps, dmap, d_out, ab;
    Py_ssize_t k;
    PyObject *active_obj, *d_omo_obj;
    if (!PyArg_ParseTuple(args, "w*y*ny*Oy*y*Oy*:decode_z", &out, &cached, &k, &starts, &active_obj, &caps, &dmap,
                          &d_omo_obj, &d_out))
        return NULL;
    PyObject *result = NULL;
    int held = 0;
    double *work = NULL;
    Py_ssize_t R = starts.len / (Py_ssize_t)sizeof(Py_ssize_t), F = caps.len / 8;
    Py_ssize_t n = k > 0 ? cached.len / 8 / k : 0;
    Py_ssize_t C4 = F ? dmap.len / 8 / F : 0, C2 = C4 / 2;
    int with_min = d_omo_obj != Py_None;
    Py_ssize_t B = (with_min ? 2 * C2 : C2) + C4;
    if (k <= 0 || check(&cached, 8, k * n, "cached") || check(&out, 8, k * R * 7, "out") || check(&d_out, 8, B * 7, "d_out"))
        goto done;
    const unsigned char *active = NULL;
    if (active_obj != Py_None) {
        if (PyObject_GetBuffer(active_obj, &ab, PyBUF_C_CONTIGUOUS) < 0) goto done;
        held = 1;
        if (check(&ab, 1, R, "active")) goto done;
        active = (const unsigned char *)ab.buf;
    }
    const Py_ssize_t *st = (const Py_ssize_t *)starts.buf;
    Py_ssize_t w = active ? n + 1 : n;  /* numpy's capped array: a zero column where some rank is idle */
    for (Py_ssize_t i = 0; i < R; i++)
        if (st[i] < 0 || st[i] >= (w ? w : 1) || (w == 0)) {
            PyErr_SetString(PyExc_ValueError, "decode_z: a start out of range");
            goto done;
        }
    work = (double *)malloc(sizeof(double) * (size_t)(F * w + F * R + C4 + B));
    if (!work) { PyErr_NoMemory(); goto done; }
    double *capped = work, *feats = capped + F * w, *x = feats + F * R, *blk = x + C4;
    const int64_t *cd = (const int64_t *)cached.buf;
    const double *cp = (const double *)caps.buf, *dm = (const double *)dmap.buf, *dout = (const double *)d_out.buf;
    double *o = (double *)out.buf;
    for (Py_ssize_t p = 0; p < k; p++) {
        const int64_t *row = cd + p * n;
        for (Py_ssize_t f = 0; f < F; f++) {
            double *cr = capped + f * w;
            for (Py_ssize_t j = 0; j < n; j++) cr[j] = np_min((double)row[j] + 1.0, cp[f]);
            if (active) cr[n] = 0.0;
            for (Py_ssize_t i = 0; i < R; i++)
                feats[f * R + i] = active ? segment_sum(cr, w, st, R, i) * (active[i] ? 1.0 : 0.0)
                                          : segment_sum(cr, w, st, R, i);
        }
        for (Py_ssize_t i = 0; i < R; i++) {
            vecmat(x, feats, F, R, i, dm, C4);
            Py_ssize_t b = 0;
            for (Py_ssize_t j = 0; j < C2; j++) blk[b++] = np_max(x[j], x[C2 + j]);
            if (with_min)
                for (Py_ssize_t j = 0; j < C2; j++) blk[b++] = np_min(x[j], x[C2 + j]);
            for (Py_ssize_t j = 0; j < C4; j++) blk[b++] = x[j];
            double *zo = o + (p * R + i) * 7;
            for (int c = 0; c < 7; c++) {
                double s = 0.0;
                for (Py_ssize_t j = 0; j < B; j++) s += blk[j] * dout[j * 7 + c];
                zo[c] = s;
            }
        }
    }
    result = Py_NewRef(Py_None);
done:
    free(work);
    if (held) PyBuffer_Release(&ab);
    PyBuffer_Release(&out); PyBuffer_Release(&cached); PyBuffer_Release(&starts); PyBuffer_Release(&caps);
    PyBuffer_Release(&dmap); PyBuffer_Release(&d_out);
    return result;
}

/* rank_rows(out, new, cached, sizes, gidx, consts, caps, maps, weights, omo, overhead, gather):
 * _rank_row of each (group, rank) item, rows [M, 8]: item m's sequences are sizes[m] entries of new and
 * cached (int64, items one after another), its group gidx[m] (intp) with query cap caps[g] (inf for
 * none), map maps[g] [F, 4C] and weights weights[g] [2C, 2]; the groups share the feature constants,
 * omo, overhead and gather (plan.RowStack). */
static PyObject *rank_rows(PyObject *module, PyObject *args) {
    Py_buffer out, nb, cb, sizes, gidx, consts, caps, maps, weights, omo, gb;
    double overhead;
    PyObject *gather_obj;
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*y*y*y*y*y*dO:rank_rows", &out, &nb, &cb, &sizes, &gidx, &consts, &caps,
                          &maps, &weights, &omo, &overhead, &gather_obj))
        return NULL;
    PyObject *result = NULL;
    int held = 0;
    double *work = NULL;
    FeatureConsts fc;
    if (unpack(&consts, &fc) < 0) goto done;
    Py_ssize_t M = sizes.len / (Py_ssize_t)sizeof(Py_ssize_t), G = caps.len / 8, total = nb.len / 8;
    Py_ssize_t C2 = omo.len / 8, C4 = 2 * C2, F = fc.nrows - 2;
    if (check(&cb, 8, total, "cached") || check(&gidx, sizeof(Py_ssize_t), M, "gidx") || check(&out, 8, 8 * M, "out")
        || check(&maps, 8, G * F * C4, "maps") || check(&weights, 8, G * C2 * 2, "weights"))
        goto done;
    const double *gather = optional(gather_obj, &gb, &held, C2, "gather");
    if (PyErr_Occurred()) goto done;
    const Py_ssize_t *sz = (const Py_ssize_t *)sizes.buf, *gi = (const Py_ssize_t *)gidx.buf;
    Py_ssize_t longest = 0, sum = 0;
    for (Py_ssize_t m = 0; m < M; m++) {
        if (sz[m] < 0 || gi[m] < 0 || gi[m] >= G) { PyErr_SetString(PyExc_ValueError, "rank_rows: bad item"); goto done; }
        if (sz[m] > longest) longest = sz[m];
        sum += sz[m];
    }
    if (sum != total) { PyErr_SetString(PyExc_ValueError, "rank_rows: sizes do not sum to the tokens"); goto done; }
    Py_ssize_t w = longest + 1;
    work = (double *)malloc(sizeof(double) * (size_t)(2 * longest + fc.nrows * w + fc.nrows + C4 + 1));
    if (!work) { PyErr_NoMemory(); goto done; }
    double *q = work, *end = q + longest, *rows = end + longest, *col = rows + fc.nrows * w, *x = col + fc.nrows;
    const int64_t *nw = (const int64_t *)nb.buf, *cd = (const int64_t *)cb.buf;
    const double *cap = (const double *)caps.buf;
    Py_ssize_t zero = 0;
    for (Py_ssize_t m = 0, at = 0; m < M; at += sz[m], m++) {
        Py_ssize_t n = sz[m], g = gi[m];
        for (Py_ssize_t j = 0; j < n; j++) {
            q[j] = np_min((double)nw[at + j], cap[g]);
            end[j] = (double)(cd[at + j] + nw[at + j]);
        }
        feature_rows(rows, &fc, q, end, n);
        /* rows have stride n + 1 here: one segment, the item's sequences and its zero column */
        for (Py_ssize_t k = 0; k < fc.nrows; k++)
            col[k] = segment_sum(rows + (Py_ssize_t)fc.order[k] * (n + 1), n + 1, &zero, 1, 0) * (n > 0 ? 1.0 : 0.0);
        vecmat(x, col, F, 1, 0, (const double *)maps.buf + g * F * C4, C4);
        double *o = (double *)out.buf + 8 * m;
        rank_times(o, o + 2, x, C2, (const double *)omo.buf, overhead, gather, col[F + 1],
                   (const double *)weights.buf + g * C2 * 2);
        o[6] = col[F];
        o[7] = col[F + 1];
    }
    result = Py_NewRef(Py_None);
done:
    free(work);
    if (held) PyBuffer_Release(&gb);
    PyBuffer_Release(&out); PyBuffer_Release(&nb); PyBuffer_Release(&cb); PyBuffer_Release(&sizes);
    PyBuffer_Release(&gidx); PyBuffer_Release(&consts); PyBuffer_Release(&caps); PyBuffer_Release(&maps);
    PyBuffer_Release(&weights); PyBuffer_Release(&omo);
    return result;
}

/* critical(kvs, transfer, attn_totals, moe_totals, both): a step's critical rank from its layer groups'
 * per-rank (attention, indexer) times kvs (a sequence of [R, 2] buffers), its pool transfers (None or
 * [R]) and its token bundles' attention-part and MoE-part totals (sequences of [R] buffers), in
 * step_assemble's order: kv = kvs summed, attn = kv[:, 0] + kv[:, 1] (+ transfer) + each attention total,
 * moe = the MoE totals summed. Writes attn + moe into both [R]; returns (ra, idle, kv[ra, 0], kv[ra, 1])
 * with ra = argmax(attn) (its first) and idle = attn[ra] <= 0 and max(moe) <= 0. */
#define MAX_PARTS 8
static PyObject *critical(PyObject *module, PyObject *args) {
    PyObject *kvs_obj, *transfer_obj, *attn_obj, *moe_obj;
    Py_buffer both, bufs[3 * MAX_PARTS + 1];
    int held = 0;
    if (!PyArg_ParseTuple(args, "OOOOw*:critical", &kvs_obj, &transfer_obj, &attn_obj, &moe_obj, &both)) return NULL;
    PyObject *result = NULL, *kvs = NULL, *attns = NULL, *moes = NULL;
    double *attn = NULL;
    Py_ssize_t R = both.len / 8;
    kvs = PySequence_Fast(kvs_obj, "critical: kvs must be a sequence");
    attns = kvs ? PySequence_Fast(attn_obj, "critical: attn_totals must be a sequence") : NULL;
    moes = attns ? PySequence_Fast(moe_obj, "critical: moe_totals must be a sequence") : NULL;
    if (!moes) goto done;
    Py_ssize_t G = PySequence_Fast_GET_SIZE(kvs), B = PySequence_Fast_GET_SIZE(attns);
    if (G < 1 || G > MAX_PARTS || B < 1 || B > MAX_PARTS || PySequence_Fast_GET_SIZE(moes) != B || R < 1) {
        PyErr_SetString(PyExc_ValueError, "critical: 1..8 layer groups and bundles, at least one rank");
        goto done;
    }
    /* every input as (base, stride between ranks, stride between columns) in bytes */
    const char *base[3 * MAX_PARTS + 1];
    Py_ssize_t rs[3 * MAX_PARTS + 1], cs[3 * MAX_PARTS + 1];
    PyObject *const *items[3] = {PySequence_Fast_ITEMS(kvs), PySequence_Fast_ITEMS(attns), PySequence_Fast_ITEMS(moes)};
    Py_ssize_t counts[3] = {G, B, B};
    int ndims[3] = {2, 1, 1};
    for (int w = 0; w < 4; w++) {
        Py_ssize_t count = w < 3 ? counts[w] : (transfer_obj != Py_None);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *obj = w < 3 ? items[w][i] : transfer_obj;
            Py_buffer *b = &bufs[held];
            if (PyObject_GetBuffer(obj, b, PyBUF_STRIDES | PyBUF_FORMAT) < 0) goto done;
            held++;
            int nd = w < 3 ? ndims[w] : 1;
            if (b->ndim != nd || b->itemsize != 8 || (b->format && strcmp(b->format, "d") != 0) || b->shape[0] != R
                || (nd == 2 && b->shape[1] != 2)) {
                PyErr_SetString(PyExc_ValueError, "critical: inputs must be float64 [R, 2] (kvs) or [R]");
                goto done;
            }
            base[held - 1] = (const char *)b->buf;
            rs[held - 1] = b->strides[0];
            cs[held - 1] = nd == 2 ? b->strides[1] : 0;
        }
    }
    #define AT(k, r, c) (*(const double *)(base[k] + (r) * rs[k] + (c) * cs[k]))
    attn = (double *)malloc(sizeof(double) * (size_t)(3 * R));
    if (!attn) { PyErr_NoMemory(); goto done; }
    double *k0 = attn + R, *k1 = k0 + R, *o = (double *)both.buf;
    int tr = transfer_obj != Py_None ? (int)(G + 2 * B) : -1;
    Py_ssize_t ra = 0;
    double moe_max = 0.0;
    for (Py_ssize_t r = 0; r < R; r++) {
        double a0 = AT(0, r, 0), a1 = AT(0, r, 1);
        for (Py_ssize_t g = 1; g < G; g++) { a0 = a0 + AT(g, r, 0); a1 = a1 + AT(g, r, 1); }
        k0[r] = a0; k1[r] = a1;
        double a = a0 + a1;
        if (tr >= 0) a = a + AT(tr, r, 0);
        double m = AT(G + B, r, 0);
        for (Py_ssize_t b = 0; b < B; b++) a = a + AT(G + b, r, 0);
        for (Py_ssize_t b = 1; b < B; b++) m = m + AT(G + B + b, r, 0);
        attn[r] = a;
        o[r] = a + m;
        if (r == 0 || m > moe_max) moe_max = m;
        if (a > attn[ra]) ra = r;
    }
    #undef AT
    int idle = attn[ra] <= 0 && moe_max <= 0;
    result = Py_BuildValue("nNdd", ra, PyBool_FromLong(idle), k0[ra], k1[ra]);
done:
    free(attn);
    for (int i = 0; i < held; i++) PyBuffer_Release(&bufs[i]);
    Py_XDECREF(kvs); Py_XDECREF(attns); Py_XDECREF(moes);
    PyBuffer_Release(&both);
    return result;
}

/* capped(values, cap): tuple(min(v, cap) for v in values) as np.minimum(values, cap).tolist() gives it */
static PyObject *capped(PyObject *module, PyObject *args) {
    Py_buffer v;
    double cap;
    if (!PyArg_ParseTuple(args, "y*d:capped", &v, &cap)) return NULL;
    Py_ssize_t n = v.len / 8;
    const double *x = (const double *)v.buf;
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *f = PyFloat_FromDouble(np_min(x[i], cap));
        if (!f) { Py_CLEAR(out); break; }
        PyTuple_SET_ITEM(out, i, f);
    }
    PyBuffer_Release(&v);
    return out;
}

/* ---- token bundles (timing/bundle_plan.py; the reference: step_cost.token_bundle) ----
 * One layer group's token-count components from its per-rank token counts, element by element as the
 * numpy of attention_cost.py / moe_cost.py does them. Constants come folded (bundle_plan.BundlePlan):
 * `scal` named slots (B_* below, the same names in bundle_plan.py), `gemms` rows of GEMM constants
 * (roofline._gemm_constants: G_* columns), the attention projections first, then the fixed rows. */

enum { B_KO, B_SMS, B_PERSM, B_NPROJ, B_MHC, B_MHC_F0, B_MHC_F1, B_MHC_F2, B_MHC_F3, B_MHC_F4, B_MHC_KK, B_MHC_DEN,
       B_MHC_TIMES, B_AR, B_AR_HID, B_AR_ALPHA, B_AR_C1, B_AR_LINK, B_AR_ONESHOT, B_AR_OKA, B_AR_RM1, B_AR_OLINK,
       B_AR_TIMES, B_DENSE_TIMES, B_NMOE, B_TOPK, B_EP, B_DISP, B_PRE, B_TILE, B_MEGA, B_GG_N, B_GG_K, B_GG_PEAK,
       B_GG_BW, B_GG_EB, B_GG_ETP, B_GG_ACT, B_GATE_C, B_GATE_VF, B_SH, B_SH_ROUTED, B_SH_PACKED, B_SH_SMALL, B_DC,
       B_DC_REMOTE, B_DC_FAR, B_DC_ROW, B_DC_LINK, B_DC_NIC, B_DC_C, B_DC_COMB, B_DC_DEN, B_LM, B_LM_SEQS, B_HOST,
       B_ENG_N, B_ENG_LAYERS, B_ENG_LAT, B_ENG_BYTES, B_ENG_DEN, B_ENG_L0, B_SLOTS = B_ENG_L0 + 8 };
enum { G_FPR, G_WB, G_BPR, G_COLS, G_SPLIT, G_CAP, G_BW, G_PEAK, G_TIMES, G_WIDTH };
/* the fixed GEMM rows after the projections */
enum { R_DENSE_UP, R_DENSE_DOWN, R_GATE, R_SH_UP, R_SH_DOWN, R_LM, R_FIXED };
/* the components, as slots of out [C_COUNT, 3 (t, tc, tm), R + 1 (the busiest EP rank last)] */
enum { C_PROJ, C_MHC, C_AR, C_DENSE, C_MOE_GEMM, C_GATE, C_SHARED, C_DC, C_LM, C_HOST, C_ENGRAM, C_COUNT };

/* roofline.gemm_time of m rows: (t, tc, tm) */
static void gemm(double *t, double *tc, double *tm, const double *g, const double *s, double m) {
    double flops = m * g[G_FPR], bytes = g[G_WB] + m * g[G_BPR], bw = g[G_BW];
    if (isnan(bw)) {
        double ctas = np_max(ceil(np_max(m, 1.0) / 128.0) * g[G_COLS], g[G_SPLIT]);
        bw = np_min(g[G_CAP], np_min(ctas, s[B_SMS]) * s[B_PERSM]);
    }
    double c = flops / g[G_PEAK], mm = bytes / bw, busy = m > 0 ? 1.0 : 0.0;
    *t = (np_max(c, mm) + s[B_KO]) * busy;
    *tc = c * busy;
    *tm = mm * busy;
}

/* moe_cost._up_down: two GEMMs summed */
static void up_down(double *t, double *tc, double *tm, const double *up, const double *down, const double *s, double m) {
    double a[3], b[3];
    gemm(a, a + 1, a + 2, up, s, m);
    gemm(b, b + 1, b + 2, down, s, m);
    *t = a[0] + b[0]; *tc = a[1] + b[1]; *tm = a[2] + b[2];
}

#define OUT(c, k, r) o[((c) * 3 + (k)) * W + (r)]

/* bundle(out, totals, tokens, seqs, scal, gemms) -> bit mask of the components present (1 << C_*);
 * totals [2, R]: the attention-part and MoE-part totals (parts.ATTN_PART / MOE_PART order) */
static PyObject *bundle(PyObject *module, PyObject *args) {
    Py_buffer ob, tb, kb, qb, sb, gb;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*y*:bundle", &ob, &tb, &kb, &qb, &sb, &gb)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t R = kb.len / 8, W = R + 1;
    const double *s = (const double *)sb.buf, *tok = (const double *)kb.buf, *seqs = (const double *)qb.buf;
    if (check(&sb, 8, B_SLOTS, "scal") || check(&qb, 8, R, "seqs") || check(&ob, 8, C_COUNT * 3 * W, "out")
        || check(&tb, 8, 2 * R, "totals") || R < 1)
        goto done;
    Py_ssize_t P = (Py_ssize_t)s[B_NPROJ];
    if (check(&gb, 8, (P + R_FIXED) * G_WIDTH, "gemms")) goto done;
    const double *gm = (const double *)gb.buf, *fixed = gm + P * G_WIDTH;
    double *o = (double *)ob.buf, *tot = (double *)tb.buf;
    memset(o, 0, (size_t)ob.len);
    long mask = (1L << C_PROJ);
    double tmax = tok[0];
    for (Py_ssize_t r = 1; r < R; r++) tmax = np_max(tmax, tok[r]);
    double tsum = pairwise_sum(tok, R);
    /* attention_cost.token_attention */
    double *terms = (double *)malloc(sizeof(double) * (size_t)(3 * P + 1));
    if (!terms) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t r = 0; r < R; r++) {
        double x = tok[r];
        for (Py_ssize_t p = 0; p < P; p++) {
            const double *g = gm + p * G_WIDTH;
            double t, c, m;
            gemm(&t, &c, &m, g, s, x);
            terms[p] = t * g[G_TIMES]; terms[P + p] = c * g[G_TIMES]; terms[2 * P + p] = m * g[G_TIMES];
        }
        /* numpy's sum over the matrices: one after another across ranks, pairwise for a lone rank */
        for (int k = 0; k < 3; k++) {
            const double *v = terms + k * P;
            double acc = v[0];
            if (R == 1) acc = pairwise_sum(v, P);
            else for (Py_ssize_t p = 1; p < P; p++) acc += v[p];
            OUT(C_PROJ, k, r) = acc;
        }
        if (s[B_MHC]) {
            double b = x * s[B_MHC_F0] * s[B_MHC_F1] * s[B_MHC_F2] * s[B_MHC_F3] * s[B_MHC_F4];
            double mt = (b / s[B_MHC_DEN] + s[B_MHC_KK] * (x > 0 ? 1.0 : 0.0)) * s[B_MHC_TIMES];
            OUT(C_MHC, 0, r) = mt; OUT(C_MHC, 2, r) = mt;
        }
        if (s[B_AR]) {
            double b = x * s[B_AR_HID] * 2.0, ar = 0.0;
            if (b > 0) {
                ar = s[B_AR_ALPHA] + s[B_AR_C1] * b / s[B_AR_LINK];
                if (s[B_AR_ONESHOT]) {
                    double one = s[B_AR_OKA] + s[B_AR_RM1] * b / s[B_AR_OLINK];
                    if (one < ar) ar = one;
                }
            }
            OUT(C_AR, 0, r) = ar * s[B_AR_TIMES];
        }
    }
    free(terms);
    if (s[B_MHC]) mask |= 1L << C_MHC;
    if (s[B_AR]) mask |= 1L << C_AR;
    /* moe_cost.moe_part: every rank, then the busiest EP rank as column R */
    if (s[B_DENSE_TIMES]) {
        mask |= 1L << C_DENSE;
        for (Py_ssize_t r = 0; r < W; r++) {
            double t, c, m, x = r < R ? tok[r] : tmax, k = s[B_DENSE_TIMES];
            up_down(&t, &c, &m, fixed + R_DENSE_UP * G_WIDTH, fixed + R_DENSE_DOWN * G_WIDTH, s, x);
            OUT(C_DENSE, 0, r) = t * k; OUT(C_DENSE, 1, r) = c * k; OUT(C_DENSE, 2, r) = m * k;
        }
    }
    double nmoe = s[B_NMOE];
    if (nmoe && tsum != 0) {
        mask |= (1L << C_MOE_GEMM) | (1L << C_GATE) | (s[B_SH] ? 1L << C_SHARED : 0) | (s[B_DC] ? 1L << C_DC : 0);
        /* moe_cost._expert_load without an expert load: the mean on every rank, the busiest last */
        double ep = s[B_EP], pre = s[B_PRE], assign = tsum * s[B_TOPK], mean, busiest;
        if (ep > 1) {
            mean = assign / ep;
            double spread = mean > 0 ? s[B_DISP] * sqrt(2.0 * mean * log(ep)) : 0.0;
            busiest = mean + spread;
        } else {
            mean = busiest = assign;
        }
        double recv[2] = {mean, busiest}, active[2], padded[2];
        for (int i = 0; i < 2; i++) active[i] = pre * (1.0 - exp(-recv[i] / pre));
        double tile = s[B_TILE];
        if (s[B_MEGA] && active[1] > 0) {
            double x = recv[1] / active[1];
            double p2 = ldexp(1.0, (int)fmax(0.0, ceil(log2(x > 1.0 ? x : 1.0))));
            tile = fmin(tile, fmax(8.0, p2));
        }
        for (int i = 0; i < 2; i++) {
            double per = active[i] > 0 ? recv[i] / active[i] : 0.0;
            padded[i] = active[i] * ceil(per / tile) * tile;
        }
        for (Py_ssize_t r = 0; r < W; r++) {
            int b = r == R;  /* the busiest EP rank's column */
            double own = b ? tmax : tok[r], rows = padded[b];
            /* grouped expert GEMM */
            double w = active[b] * s[B_GG_EB] / s[B_GG_ETP];
            double flops = 2.0 * rows * s[B_GG_N] * s[B_GG_K], bytes = w + rows * s[B_GG_ACT];
            double c = flops / s[B_GG_PEAK], m = bytes / s[B_GG_BW];
            double t = np_max(c, m) + s[B_KO] * (w > 0 ? 1.0 : 0.0);
            OUT(C_MOE_GEMM, 0, r) = t * nmoe; OUT(C_MOE_GEMM, 1, r) = c * nmoe; OUT(C_MOE_GEMM, 2, r) = m * nmoe;
            /* gate */
            gemm(&t, &c, &m, fixed + R_GATE * G_WIDTH, s, own);
            double elem = own * s[B_GATE_C] / s[B_GATE_VF];
            OUT(C_GATE, 0, r) = (t + elem) * nmoe; OUT(C_GATE, 1, r) = (c + elem) * nmoe; OUT(C_GATE, 2, r) = m * nmoe;
            if (s[B_SH]) {
                up_down(&t, &c, &m, fixed + R_SH_UP * G_WIDTH, fixed + R_SH_DOWN * G_WIDTH, s, own);
                if (s[B_SH_ROUTED] && own < s[B_SH_SMALL] && own > 0) {
                    t = np_min(t, s[B_SH_PACKED]);
                    m = np_min(m, s[B_SH_PACKED]);
                }
                OUT(C_SHARED, 0, r) = t * nmoe; OUT(C_SHARED, 1, r) = c * nmoe; OUT(C_SHARED, 2, r) = m * nmoe;
            }
            if (s[B_DC]) {
                double remote = s[B_DC_REMOTE], far = s[B_DC_FAR];
                double moved = np_max(own * s[B_TOPK] * remote, recv[b] * remote);
                double tb_ = moved * (1.0 - far) * s[B_DC_ROW] / s[B_DC_LINK];
                if (far > 0.0) tb_ = np_max(tb_, moved * far * s[B_DC_ROW] / s[B_DC_NIC]);
                double d = s[B_DC_C] + tb_, red = own * s[B_TOPK] * s[B_DC_COMB] / s[B_DC_DEN];
                OUT(C_DC, 0, r) = (moved > 0 ? d + red : 0.0) * nmoe;
            }
        }
    }
    /* lm_head and the host's step work (the all-token layer group) */
    if (s[B_LM]) {
        mask |= 1L << C_LM;
        for (Py_ssize_t r = 0; r < R; r++)
            gemm(&OUT(C_LM, 0, r), &OUT(C_LM, 1, r), &OUT(C_LM, 2, r), fixed + R_LM * G_WIDTH, s,
                 s[B_LM_SEQS] ? seqs[r] : tok[r]);
    }
    if (s[B_HOST] > 0.0) {
        mask |= 1L << C_HOST;
        for (Py_ssize_t r = 0; r < R; r++) OUT(C_HOST, 0, r) = s[B_HOST] * (tok[r] > 0 ? 1.0 : 0.0);
    }
    /* the parts' totals in parts.ATTN_PART and MOE_PART order (engram's before it is added) */
    static const int attn_order[] = {C_PROJ, C_MHC, C_AR, C_ENGRAM, C_LM, C_HOST};
    static const int moe_order[] = {C_GATE, C_DC, C_MOE_GEMM, C_SHARED, C_DENSE};
    Py_ssize_t nengram = (Py_ssize_t)s[B_ENG_N];
    for (int pass = nengram ? 0 : 1; pass < 2; pass++) {
        for (Py_ssize_t r = 0; r < R; r++) {
            double a = 0.0, m = 0.0;
            for (int i = 0; i < 6; i++)
                if (mask & (1L << attn_order[i])) a = a + OUT(attn_order[i], 0, r);
            for (int i = 0; i < 5; i++)
                if (mask & (1L << moe_order[i])) m = m + OUT(moe_order[i], 0, r);
            if (pass == 1) { tot[r] = a; tot[R + r] = m; continue; }
            /* attention_cost.engram: the fetch less the layers before it, per engram layer */
            double per_layer = (a + m) / s[B_ENG_LAYERS], x = tok[r];
            double fetch = s[B_ENG_LAT] + x * s[B_ENG_BYTES] / s[B_ENG_DEN], total = 0.0;
            for (Py_ssize_t i = 0; i < nengram; i++) {
                double exposed = np_max(0.0, fetch - s[B_ENG_L0 + i] * per_layer) + s[B_KO];
                total = total + exposed * (x > 0 ? 1.0 : 0.0);
            }
            OUT(C_ENGRAM, 0, r) = total;
        }
        if (pass == 0) mask |= 1L << C_ENGRAM;
    }
    result = PyLong_FromLong(mask);
done:
    PyBuffer_Release(&ob); PyBuffer_Release(&tb); PyBuffer_Release(&kb); PyBuffer_Release(&qb);
    PyBuffer_Release(&sb); PyBuffer_Release(&gb);
    return result;
}
#undef OUT

static PyMethodDef methods[] = {
    {"features", features, METH_VARARGS,
     "features(out, q, end, starts, nonempty, zeros, consts): a layer group's per-rank context features"},
    {"kv_cm", kv_cm, METH_VARARGS,
     "kv_cm(kv, cm, f, fmap, omo, overhead, gather, weights): per-rank attention/indexer times and totals"},
    {"decode_z", decode_z, METH_VARARGS,
     "decode_z(out, cached, k, starts, active, caps, dmap, d_omo, d_out): single-token decode per-rank totals"},
    {"rank_rows", rank_rows, METH_VARARGS,
     "rank_rows(out, new, cached, sizes, gidx, consts, caps, maps, weights, omo, overhead, gather): prefill rows"},
    {"critical", critical, METH_VARARGS,
     "critical(kvs, transfer, attn_totals, moe_totals, both): (ra, idle, a_t, i_t) of a step, attn + moe into both"},
    {"capped", capped, METH_VARARGS, "capped(values, cap): tuple(min(v, cap) for v in values)"},
    {"bundle", bundle, METH_VARARGS,
     "bundle(out, totals, tokens, seqs, scal, gemms): a layer group's token bundle components; their mask"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pricer", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pricer(void) { return PyModule_Create(&module); }
