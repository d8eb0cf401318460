/* The decoder step's loop-heavy host work (DESIGN.md "Decoder"): trie merge, top-T selection,
 * the ancestor block of the attention mask and greedy acceptance, for every row of a batch in one
 * call each. decoder/tree.py, decoder/attention.py and decoder/verify.py wrap it; the numpy
 * versions it replaced (one vectorised pass per depth level, ~1-3 us of call overhead each) are
 * the references of tests/test_decoder_step_kernel.py, which checks exact equality.
 *
 * Plain C API, no numpy headers: arrays come in as C-contiguous buffers (int64 'q'/'l', int32 'i',
 * float64 'd', bool '?'); outputs are preallocated by the caller and filled in place. The GIL is
 * released for the work. Every float result is computed with the same IEEE operations, in the
 * same order, as the numpy reference, so results are bit-identical.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define EVIDENCE_BINS 8
#define MAX_VIEWS 32

/* ------------------------------------------------------------------------------------ buffers */

typedef struct {
    Py_buffer v[MAX_VIEWS];
    int n;
} Views;

static void views_release(Views *vs) {
    for (int i = 0; i < vs->n; i++) PyBuffer_Release(&vs->v[i]);
    vs->n = 0;
}

/* A C-contiguous buffer of `kind` ('q' int64, 'i' int32, 'd' float64, '?' bool): its data and
 * item count, or NULL with an exception set. */
static void *view(Views *vs, PyObject *o, char kind, int writable, int64_t *len, const char *name) {
    if (vs->n >= MAX_VIEWS) {
        PyErr_SetString(PyExc_RuntimeError, "_step: too many buffers");
        return NULL;
    }
    Py_buffer *b = &vs->v[vs->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0) return NULL;
    vs->n++;
    const char *f = b->format ? b->format : "B";
    while (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = f[0] != 0 && f[1] == 0;
    if (ok) {
        switch (kind) {
        case 'q': ok = (f[0] == 'q' || f[0] == 'l') && b->itemsize == 8; break;
        case 'i': ok = (f[0] == 'i' || f[0] == 'l') && b->itemsize == 4; break;
        case 'd': ok = f[0] == 'd' && b->itemsize == 8; break;
        default: ok = f[0] == '?' && b->itemsize == 1; break;
        }
    }
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "_step: %s must be a contiguous %s array, got format %s", name,
                     kind == 'q' ? "int64" : kind == 'i' ? "int32" : kind == 'd' ? "float64" : "bool",
                     b->format ? b->format : "B");
        return NULL;
    }
    if (len) *len = (int64_t)(b->len / b->itemsize);
    return b->buf;
}

static PyObject *fail(Views *vs) {
    views_release(vs);
    return NULL;
}

/* Errors found with the GIL released. */
enum { OK = 0, E_NOMEM, E_PARENT, E_ROWS, E_SOURCE, E_SHAPE, E_KEEP, E_CLOSED, E_SLOT };

static PyObject *raise(Views *vs, int err) {
    views_release(vs);
    switch (err) {
    case E_NOMEM: return PyErr_NoMemory();
    case E_PARENT: PyErr_SetString(PyExc_ValueError, "_step: a parent must be -1 or an earlier node of its row"); break;
    case E_ROWS: PyErr_SetString(PyExc_ValueError, "_step: trees must come row by row (rows non-decreasing, < B)"); break;
    case E_SOURCE: PyErr_SetString(PyExc_IndexError, "_step: a source index is out of range"); break;
    case E_SHAPE: PyErr_SetString(PyExc_ValueError, "_step: array shapes disagree"); break;
    case E_KEEP: PyErr_SetString(PyExc_ValueError, "_step: kept indices must be ascending and in range"); break;
    case E_CLOSED: PyErr_SetString(PyExc_AssertionError, "top-T selection is not ancestor-closed"); break;
    default: PyErr_SetString(PyExc_IndexError, "_step: a slot is out of range"); break;
    }
    return NULL;
}

/* numpy's maximum: NaN propagates from either side. */
static inline double np_max(double a, double b) { return (a >= b || a != a) ? a : b; }
/* numpy's clip(p, 0, 1): NaN stays NaN. */
static inline double clip01(double p) { return p < 0.0 ? 0.0 : (p > 1.0 ? 1.0 : p); }

/* ---------------------------------------------------------------------------------------- merge */

typedef struct {
    int64_t par, tok, i;
} Key;

static int key_cmp(const void *a, const void *b) {
    const Key *x = a, *y = b;
    if (x->par != y->par) return x->par < y->par ? -1 : 1;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static void sort_keys(Key *k, int64_t n) {
    if (n > 24) {
        qsort(k, (size_t)n, sizeof(Key), key_cmp);
        return;
    }
    for (int64_t i = 1; i < n; i++) {
        Key x = k[i];
        int64_t j = i;
        while (j > 0 && key_cmp(&k[j - 1], &x) > 0) k[j] = k[j - 1], j--;
        k[j] = x;
    }
}

typedef struct {
    /* inputs */
    const int32_t *tok, *lpar;
    const int64_t *counts, *meta, *max_depths;
    const double *factors;
    int64_t n, p, b, s, fd, fe, fs;
    double smoothing;
    /* outputs: [4, n] tokens, parents, depths, sources; [n, s] raw_p, bins; [2, n] cond, path */
    int64_t *oi, *bins, *starts;
    double *raw_p, *of;
} Merge;

static int merge_run(Merge *g, int64_t *n_out) {
    int64_t n = g->n, P = g->p, S = g->s;
    int64_t *scratch = malloc(sizeof(int64_t) * (size_t)(5 * n + 1));
    double *dbl = malloc(sizeof(double) * (size_t)(4 * n + P + 1));
    Key *keys = malloc(sizeof(Key) * (size_t)(n + 1));
    if (!scratch || !dbl || !keys) {
        free(scratch), free(dbl), free(keys);
        return E_NOMEM;
    }
    int64_t *gpar = scratch, *depth = scratch + n, *mid = scratch + 2 * n, *tree = scratch + 3 * n,
            *lvl = scratch + 4 * n;
    double *cnt = dbl, *raw = dbl + n, *denom = dbl + 2 * n, *sib = dbl + 3 * n; /* sib: [n + P] */
    int err = OK;
    /* global parents, depths, per-node tree, counts */
    int64_t off = 0;
    for (int64_t t = 0; t < P; t++) {
        int64_t size = g->meta[3 * t], r = g->meta[3 * t + 1], src = g->meta[3 * t + 2];
        if (size < 0 || off + size > n) { err = E_SHAPE; goto done; }
        if (r < 0 || r >= g->b || (t && r < g->meta[3 * (t - 1) + 1])) { err = E_ROWS; goto done; }
        if (src < 0 || src >= S) { err = E_SOURCE; goto done; }
        for (int64_t i = off; i < off + size; i++) {
            int64_t lp = g->lpar[i];
            if (lp < -1 || lp >= i - off) { err = E_PARENT; goto done; }
            gpar[i] = lp >= 0 ? lp + off : -1;
            depth[i] = lp >= 0 ? depth[gpar[i]] + 1 : 1;
            tree[i] = t;
            cnt[i] = g->counts[i] > 0 ? (double)g->counts[i] : 0.0;
        }
        off += size;
    }
    if (off != n) { err = E_SHAPE; goto done; }
    /* denominators: max(parent count, sum of sibling counts), summed in index order (bincount) */
    for (int64_t i = 0; i < n + P; i++) sib[i] = 0.0;
    for (int64_t i = 0; i < n; i++) sib[gpar[i] >= 0 ? gpar[i] : n + tree[i]] += cnt[i];
    for (int64_t i = 0; i < n; i++) {
        double pc = gpar[i] >= 0 ? cnt[gpar[i]] : 0.0;
        double ss = sib[gpar[i] >= 0 ? gpar[i] : n + tree[i]];
        double d = np_max(pc, ss);
        denom[i] = d;
        raw[i] = clip01(d > 0 ? cnt[i] / (d + g->smoothing) : 0.0);
        mid[i] = -1;
    }
    /* per row: unite equal paths level by level; a level ordered by (merged parent, token) */
    int64_t m = 0, t0 = 0, row_lo = 0;
    for (int64_t r = 0; r < g->b; r++) {
        g->starts[r] = m;
        int64_t t1 = t0;
        while (t1 < P && g->meta[3 * t1 + 1] == r) t1++;
        int64_t lo = row_lo, hi = lo;
        for (int64_t t = t0; t < t1; t++) hi += g->meta[3 * t];
        t0 = t1, row_lo = hi;
        int64_t md = g->max_depths[r], top = 0;
        for (int64_t i = lo; i < hi; i++)
            if (depth[i] <= md && depth[i] > top) top = depth[i];
        if (!top) continue;
        /* stable bucket by depth: lvl holds the row's fitting nodes depth by depth, input order */
        int64_t *dstart = malloc(sizeof(int64_t) * (size_t)(top + 2));
        if (!dstart) { err = E_NOMEM; goto done; }
        for (int64_t d = 0; d <= top + 1; d++) dstart[d] = 0;
        for (int64_t i = lo; i < hi; i++)
            if (depth[i] <= md) dstart[depth[i] + 1]++;
        for (int64_t d = 1; d <= top + 1; d++) dstart[d] += dstart[d - 1];
        for (int64_t i = lo; i < hi; i++)
            if (depth[i] <= md) lvl[lo + dstart[depth[i]]++] = i;
        /* dstart[d] is now the end of level d (= start of level d + 1) */
        int64_t begin = 0;
        for (int64_t d = 1; d <= top; d++) {
            int64_t end = dstart[d], k = 0;
            if (end == begin) break;
            for (int64_t j = begin; j < end; j++) {
                int64_t i = lvl[lo + j];
                keys[k].par = gpar[i] >= 0 ? mid[gpar[i]] : -1;
                keys[k].tok = g->tok[i];
                keys[k].i = i;
                k++;
            }
            sort_keys(keys, k);
            for (int64_t j = 0; j < k; j++) {
                if (!j || keys[j].par != keys[j - 1].par || keys[j].tok != keys[j - 1].tok) {
                    g->oi[m] = keys[j].tok;
                    g->oi[n + m] = keys[j].par;
                    g->oi[2 * n + m] = d;
                    g->oi[3 * n + m] = 0;
                    m++;
                }
                mid[keys[j].i] = m - 1;
            }
            begin = end;
        }
        free(dstart);
    }
    g->starts[g->b] = m;
    /* sources, raw_p and evidence bins: maxima over the merged inputs */
    for (int64_t i = 0; i < n; i++) {
        int64_t j = mid[i];
        if (j < 0) continue;
        int64_t src = g->meta[3 * tree[i] + 2];
        g->oi[3 * n + j] |= (int64_t)1 << src;
        double *rp = &g->raw_p[j * S + src];
        *rp = np_max(*rp, raw[i]);
        int64_t ev = 0;
        double dd = denom[i] > 1.0 ? denom[i] : 1.0; /* floor(log2(max(denom, 1))), exact */
        if (dd == dd && dd <= 1.7976931348623157e308) {
            int e;
            frexp(dd, &e);
            ev = e - 1;
        } else {
            ev = EVIDENCE_BINS - 1;
        }
        if (ev < 0) ev = 0;
        if (ev > EVIDENCE_BINS - 1) ev = EVIDENCE_BINS - 1;
        int64_t *bp = &g->bins[j * S + src];
        if (ev > *bp) *bp = ev;
    }
    /* combine: 1 - prod_s (1 - clip(raw_p * factor)), then the path products */
    for (int64_t j = 0; j < m; j++) {
        double acc = 0.0;
        int64_t col = g->oi[2 * n + j] < g->fd ? g->oi[2 * n + j] : g->fd;
        col -= 1;
        for (int64_t s = 0; s < S; s++) {
            double p = g->raw_p[j * S + s];
            if (g->factors) {
                int64_t b = g->bins[j * S + s] < g->fe - 1 ? g->bins[j * S + s] : g->fe - 1;
                p = p * g->factors[(s * g->fd + col) * g->fe + b];
            }
            double q = 1.0 - clip01(p);
            acc = s ? acc * q : q;
        }
        double c = 1.0 - acc;
        g->of[j] = c;
        int64_t par = g->oi[n + j];
        g->of[n + j] = par >= 0 ? c * g->of[n + par] : c;
    }
    *n_out = m;
done:
    free(scratch), free(dbl), free(keys);
    return err;
}

static PyObject *py_merge(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_par, *o_cnt, *o_meta, *o_md, *o_fac, *o_oi, *o_raw, *o_bins, *o_of, *o_starts;
    Merge g;
    memset(&g, 0, sizeof g);
    long long S;
    if (!PyArg_ParseTuple(args, "OOOOOdOLOOOOO", &o_tok, &o_par, &o_cnt, &o_meta, &o_md, &g.smoothing,
                          &o_fac, &S, &o_oi, &o_raw, &o_bins, &o_of, &o_starts))
        return NULL;
    Views vs = {.n = 0};
    int64_t n, n2, n3, p3, b, oi, nraw, nbins, nof, nst, nf = 0;
    if (!(g.tok = view(&vs, o_tok, 'i', 0, &n, "tokens"))) return fail(&vs);
    if (!(g.lpar = view(&vs, o_par, 'i', 0, &n2, "parents"))) return fail(&vs);
    if (!(g.counts = view(&vs, o_cnt, 'q', 0, &n3, "counts"))) return fail(&vs);
    if (!(g.meta = view(&vs, o_meta, 'q', 0, &p3, "meta"))) return fail(&vs);
    if (!(g.max_depths = view(&vs, o_md, 'q', 0, &b, "max_depths"))) return fail(&vs);
    if (o_fac != Py_None) {
        PyObject *fa, *fd, *fe;
        if (!PyArg_ParseTuple(o_fac, "OOO", &fa, &fd, &fe)) return fail(&vs);
        if (!(g.factors = view(&vs, fa, 'd', 0, &nf, "factors"))) return fail(&vs);
        g.fd = PyLong_AsLongLong(fd), g.fe = PyLong_AsLongLong(fe);
        if (PyErr_Occurred()) return fail(&vs);
        if (g.fd < 1 || g.fe < 1 || nf < S * g.fd * g.fe) return raise(&vs, E_SHAPE);
    }
    if (!(g.oi = view(&vs, o_oi, 'q', 1, &oi, "out ints"))) return fail(&vs);
    if (!(g.raw_p = view(&vs, o_raw, 'd', 1, &nraw, "raw_p"))) return fail(&vs);
    if (!(g.bins = view(&vs, o_bins, 'q', 1, &nbins, "bins"))) return fail(&vs);
    if (!(g.of = view(&vs, o_of, 'd', 1, &nof, "out floats"))) return fail(&vs);
    if (!(g.starts = view(&vs, o_starts, 'q', 1, &nst, "starts"))) return fail(&vs);
    g.n = n, g.p = p3 / 3, g.b = b, g.s = S;
    if (S < 1 || n2 != n || n3 != n || p3 % 3 || oi != 4 * n || nraw != n * S || nbins != n * S
        || nof != 2 * n || nst != b + 1)
        return raise(&vs, E_SHAPE);
    int64_t m = 0;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = merge_run(&g, &m);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return PyLong_FromLongLong(m);
}

/* ---------------------------------------------------------------------------- path products */

static PyObject *py_path_products(PyObject *self, PyObject *args) {
    PyObject *o_cond, *o_par, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_cond, &o_par, &o_out)) return NULL;
    Views vs = {.n = 0};
    int64_t n, n2, n3;
    const double *cond;
    const int64_t *par;
    double *out;
    if (!(cond = view(&vs, o_cond, 'd', 0, &n, "cond_p"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &n2, "parents"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'd', 1, &n3, "out"))) return fail(&vs);
    if (n2 != n || n3 != n) return raise(&vs, E_SHAPE);
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        if (par[i] >= i || par[i] < -1) { err = E_PARENT; break; }
        out[i] = par[i] >= 0 ? cond[i] * out[par[i]] : cond[i];
    }
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------- ranking, top-T */

typedef struct {
    uint64_t key; /* -path_p as an order-preserving integer */
    int64_t i;
} Rank;

/* numpy lexsort order of (-p, index) as one integer order: NaN last (all NaNs equal), -0.0 equal
 * to 0.0, equal keys by index. */
static inline uint64_t desc_key(double p) {
    double x = -p;
    if (x != x) return UINT64_MAX;
    if (x == 0.0) x = 0.0;
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

static inline int rank_before(const Rank *a, const Rank *b) {
    return a->key < b->key || (a->key == b->key && a->i < b->i);
}

/* insertion sort of runs of 16, then bottom-up merges through tmp */
static void sort_ranks(Rank *k, Rank *tmp, int64_t n) {
    const int64_t run = 16;
    for (int64_t lo = 0; lo < n; lo += run) {
        int64_t hi = lo + run < n ? lo + run : n;
        for (int64_t i = lo + 1; i < hi; i++) {
            Rank x = k[i];
            int64_t j = i;
            while (j > lo && rank_before(&x, &k[j - 1])) k[j] = k[j - 1], j--;
            k[j] = x;
        }
    }
    Rank *src = k, *dst = tmp;
    for (int64_t w = run; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) dst[o++] = rank_before(&src[b], &src[a]) ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        Rank *t = src;
        src = dst, dst = t;
    }
    if (src != k) memcpy(k, src, sizeof(Rank) * (size_t)n);
}

static int rank_rows(const double *p, const int64_t *starts, int64_t b, int64_t n, int64_t *order) {
    if (starts[0] != 0 || starts[b] != n) return E_SHAPE;
    Rank *k = malloc(sizeof(Rank) * (size_t)(2 * n + 1));
    if (!k) return E_NOMEM;
    for (int64_t r = 0; r < b; r++) {
        int64_t lo = starts[r], hi = starts[r + 1];
        if (hi < lo || hi > n) { free(k); return E_SHAPE; }
        for (int64_t i = lo; i < hi; i++) k[i - lo].key = desc_key(p[i]), k[i - lo].i = i;
        sort_ranks(k, k + n, hi - lo);
        for (int64_t i = lo; i < hi; i++) order[i] = k[i - lo].i;
    }
    free(k);
    return OK;
}

static PyObject *py_ranked(PyObject *self, PyObject *args) {
    PyObject *o_p, *o_starts, *o_out;
    if (!PyArg_ParseTuple(args, "OOO", &o_p, &o_starts, &o_out)) return NULL;
    Views vs = {.n = 0};
    int64_t n, b1, n2;
    const double *p;
    const int64_t *starts;
    int64_t *out;
    if (!(p = view(&vs, o_p, 'd', 0, &n, "path_p"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'q', 1, &n2, "out"))) return fail(&vs);
    if (n2 != n || b1 < 1) return raise(&vs, E_SHAPE);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = rank_rows(p, starts, b1 - 1, n, out);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* select(path_p, parents, starts, n, order | None, keep_out) -> k: the n[r] best nodes of each
 * row, ascending. */
static PyObject *py_select(PyObject *self, PyObject *args) {
    PyObject *o_p, *o_par, *o_starts, *o_n, *o_order, *o_keep;
    if (!PyArg_ParseTuple(args, "OOOOOO", &o_p, &o_par, &o_starts, &o_n, &o_order, &o_keep)) return NULL;
    Views vs = {.n = 0};
    int64_t n, n2, b1, bn, no = 0, nk;
    const double *p;
    const int64_t *par, *starts, *want, *given = NULL;
    int64_t *keep;
    if (!(p = view(&vs, o_p, 'd', 0, &n, "path_p"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &n2, "parents"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(want = view(&vs, o_n, 'q', 0, &bn, "n"))) return fail(&vs);
    if (o_order != Py_None && !(given = view(&vs, o_order, 'q', 0, &no, "order"))) return fail(&vs);
    if (!(keep = view(&vs, o_keep, 'q', 1, &nk, "keep"))) return fail(&vs);
    int64_t b = b1 - 1;
    if (n2 != n || b < 0 || bn != b || nk != n || (given && no != n)) return raise(&vs, E_SHAPE);
    int err = OK;
    int64_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *buf = malloc(sizeof(int64_t) * (size_t)(2 * n + 1));
    if (!buf) err = E_NOMEM;
    int64_t *order = buf, *rank = buf ? buf + n : NULL;
    if (!err && starts[0] == 0 && starts[b] == n) {
        for (int64_t r = 0; r < b && !err; r++)
            if (starts[r + 1] < starts[r]) err = E_SHAPE;
    } else if (!err) {
        err = E_SHAPE;
    }
    if (!err) {
        if (given) {
            memcpy(order, given, sizeof(int64_t) * (size_t)n);
        } else {
            err = rank_rows(p, starts, b, n, order);
        }
    }
    if (!err) {
        /* rank[order[j]] = j - starts[row of order[j]] (order is row by row) */
        for (int64_t j = 0; j < n && !err; j++) {
            int64_t i = order[j];
            if (i < 0 || i >= n) { err = E_KEEP; break; }
            int64_t lo = 0, hi = b; /* the row of node i: binary search in starts */
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (starts[mid + 1] <= i) lo = mid + 1; else hi = mid;
            }
            rank[i] = j - starts[lo];
        }
    }
    if (!err) {
        for (int64_t r = 0; r < b; r++)
            for (int64_t i = starts[r]; i < starts[r + 1]; i++)
                if (rank[i] < want[r]) keep[k++] = i;
        /* ancestor-closed: every kept node's parent is kept */
        for (int64_t j = 0; j < k; j++) order[keep[j]] = -2; /* mark kept */
        for (int64_t j = 0; j < k && !err; j++) {
            int64_t q = par[keep[j]];
            if (q >= n) err = E_PARENT;
            else if (q >= 0 && order[q] != -2) err = E_CLOSED;
        }
    }
    free(buf);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return PyLong_FromLongLong(k);
}

/* kept(tokens, parents, depths, starts, keep, out [5, k], kstarts [B + 1]): the kept nodes
 * re-indexed; out rows: tokens, parents (into the kept arrays, -1 = root), local, depths, row. */
static PyObject *py_kept(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_par, *o_dep, *o_starts, *o_keep, *o_out, *o_ks;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o_tok, &o_par, &o_dep, &o_starts, &o_keep, &o_out, &o_ks)) return NULL;
    Views vs = {.n = 0};
    int64_t n, n2, n3, b1, k, no, nks;
    const int64_t *tok, *par, *dep, *starts, *keep;
    int64_t *out, *ks;
    if (!(tok = view(&vs, o_tok, 'q', 0, &n, "tokens"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &n2, "parents"))) return fail(&vs);
    if (!(dep = view(&vs, o_dep, 'q', 0, &n3, "depths"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(keep = view(&vs, o_keep, 'q', 0, &k, "keep"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'q', 1, &no, "out"))) return fail(&vs);
    if (!(ks = view(&vs, o_ks, 'q', 1, &nks, "kept starts"))) return fail(&vs);
    int64_t b = b1 - 1;
    if (n2 != n || n3 != n || b < 0 || no != 5 * k || nks != b1) return raise(&vs, E_SHAPE);
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    int64_t *new = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!new) err = E_NOMEM;
    for (int64_t i = 0; !err && i < n; i++) new[i] = -1;
    for (int64_t j = 0; !err && j < k; j++) {
        if (keep[j] < 0 || keep[j] >= n || (j && keep[j] <= keep[j - 1])) err = E_KEEP;
        else new[keep[j]] = j;
    }
    for (int64_t r = 0; !err && r <= b; r++) ks[r] = 0;
    if (!err && b && (starts[0] != 0 || starts[b] != n)) err = E_SHAPE;
    int64_t r = 0;
    for (int64_t j = 0; !err && j < k; j++) {
        int64_t i = keep[j];
        while (r < b && starts[r + 1] <= i) r++; /* keep ascending: the row never goes back */
        int64_t q = par[i];
        if (q >= n) { err = E_PARENT; break; }
        out[j] = tok[i];
        out[k + j] = q >= 0 ? new[q] : -1;
        out[3 * k + j] = dep[i];
        out[4 * k + j] = r;
        ks[r + 1]++;
    }
    if (!err) {
        for (int64_t x = 0; x < b; x++) ks[x + 1] += ks[x];
        for (int64_t j = 0; j < k; j++) out[2 * k + j] = j - ks[out[4 * k + j]];
    }
    free(new);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------- verification inputs */

/* width(starts, m) -> q = max_r 1 + n_r + m_r (0 rows: 0). */
static PyObject *py_width(PyObject *self, PyObject *args) {
    PyObject *o_starts, *o_m;
    if (!PyArg_ParseTuple(args, "OO", &o_starts, &o_m)) return NULL;
    Views vs = {.n = 0};
    int64_t b1, bm;
    const int64_t *starts, *m;
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(m = view(&vs, o_m, 'q', 0, &bm, "m"))) return fail(&vs);
    if (bm != b1 - 1) return raise(&vs, E_SHAPE);
    int64_t q = 0;
    for (int64_t r = 0; r < bm; r++) {
        int64_t w = 1 + starts[r + 1] - starts[r] + m[r];
        if (w > q) q = w;
    }
    views_release(&vs);
    return PyLong_FromLongLong(q);
}

/* One additive mask value: 0 (attend) or `low` (the dtype's lowest), as the bit pattern of a 2- or
 * 4-byte float. */
static inline void put_bits(void *buf, int64_t i, int size, uint32_t bits) {
    if (size == 2) ((uint16_t *)buf)[i] = (uint16_t)bits;
    else ((uint32_t *)buf)[i] = bits;
}

/* inputs(tokens, parents, depths, starts, roots, bases, m, pad_id, valid [B, S] bool, low_bits, full,
 * ids_pos [2, B, q] int64, mask): the ids, positions and additive mask of build_batch, the mask as
 * raw bits of 2- or 4-byte floats: 0 attend, low_bits (the dtype's lowest) masked. full = 0: mask
 * is [B, S + q * q], per row the committed prefix's mask (valid) then the [q, q] block of the new
 * slots, for the device to broadcast; full = 1: mask is [B, q, S + q], the whole mask. Each slot
 * attends itself (padding: itself and the prefix), every real slot the last committed token, each
 * node its ancestors; side branches excepted: m[r] counts their slots as real. */
static PyObject *py_inputs(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_par, *o_dep, *o_starts, *o_roots, *o_bases, *o_m, *o_valid, *o_ip, *o_mask;
    long long pad, low;
    int full;
    if (!PyArg_ParseTuple(args, "OOOOOOOLOLpOO", &o_tok, &o_par, &o_dep, &o_starts, &o_roots, &o_bases, &o_m,
                          &pad, &o_valid, &low, &full, &o_ip, &o_mask))
        return NULL;
    Views vs = {.n = 0};
    int64_t k, k2, k3, b1, br, bb, bm, nvalid, nip;
    const int64_t *tok, *par, *dep, *starts, *roots, *bases, *m;
    const char *valid;
    int64_t *ip;
    if (!(tok = view(&vs, o_tok, 'q', 0, &k, "tokens"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &k2, "parents"))) return fail(&vs);
    if (!(dep = view(&vs, o_dep, 'q', 0, &k3, "depths"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(roots = view(&vs, o_roots, 'q', 0, &br, "roots"))) return fail(&vs);
    if (!(bases = view(&vs, o_bases, 'q', 0, &bb, "bases"))) return fail(&vs);
    if (!(m = view(&vs, o_m, 'q', 0, &bm, "m"))) return fail(&vs);
    if (!(valid = view(&vs, o_valid, '?', 0, &nvalid, "valid"))) return fail(&vs);
    if (!(ip = view(&vs, o_ip, 'q', 1, &nip, "ids_pos"))) return fail(&vs);
    Py_buffer *mb = &vs.v[vs.n];  /* the mask: any 2- or 4-byte items, written as raw bits */
    if (PyObject_GetBuffer(o_mask, mb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return fail(&vs);
    vs.n++;
    int size = (int)mb->itemsize;
    int64_t b = b1 - 1;
    if (k2 != k || k3 != k || b < 0 || br != b || bb != b || bm != b || (size != 2 && size != 4))
        return raise(&vs, E_SHAPE);
    int64_t q = b ? nip / (2 * b) : 0, S = b ? nvalid / b : 0;
    int64_t row_len = full ? q * (S + q) : S + q * q;  /* mask items per row */
    if (nip != 2 * b * q || nvalid != b * S || (int64_t)(mb->len / size) != b * row_len
        || (b && (starts[0] != 0 || starts[b] != k)))
        return raise(&vs, E_SHAPE);
    void *mask = mb->buf;
    uint32_t lo_bits = (uint32_t)low;
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    char *blk = malloc((size_t)(q * q) + 1);  /* one row's [q, q] block, 1 = attend */
    if (!blk) err = E_NOMEM;
    for (int64_t r = 0; r < b && !err; r++) {
        int64_t lo = starts[r], hi = starts[r + 1], real = 1 + hi - lo + m[r];
        if (hi < lo || real > q || m[r] < 0) { err = E_SLOT; break; }
        int64_t *ir = ip + r * q, *pr = ip + (b + r) * q;
        memset(blk, 0, (size_t)(q * q));
        ir[0] = roots[r];
        for (int64_t j = 1; j < q; j++) ir[j] = pad;
        for (int64_t j = 0; j < q; j++) pr[j] = bases[r];
        for (int64_t j = 0; j < q; j++) blk[j * q + j] = 1;
        for (int64_t j = 0; j < real; j++) blk[j * q] = 1;
        for (int64_t i = lo; i < hi; i++) {
            int64_t s = 1 + i - lo;
            ir[s] = tok[i];
            pr[s] = bases[r] + dep[i];
            for (int64_t u = par[i]; u >= 0; u = par[u]) {
                if (u < lo || u >= i) { err = E_PARENT; break; }
                blk[s * q + 1 + u - lo] = 1;
            }
            if (err) break;
        }
        if (err) break;
        const char *vr = valid + r * S;
        int64_t base = r * row_len, stride = full ? S + q : S;  /* a query row's prefix; 0 = shared */
        for (int64_t c = 0; c < S; c++) put_bits(mask, base + c, size, vr[c] ? 0u : lo_bits);
        for (int64_t j = 1; j < (full ? q : 1); j++)  /* the other queries' prefix: copies of the first */
            memcpy((char *)mask + (base + j * stride) * size, (char *)mask + base * size, (size_t)(S * size));
        for (int64_t j = 0; j < q; j++) {
            int64_t at = full ? base + j * stride + S : base + S + j * q;
            for (int64_t c = 0; c < q; c++) put_bits(mask, at + c, size, blk[j * q + c] ? 0u : lo_bits);
        }
    }
    free(blk);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* -------------------------------------------------------------------------------- acceptance */

/* The cores below work on plain arrays, without the GIL; the py_* functions around them parse
 * their own arguments, and `settle` runs several in one call. */

/* Per row the deepest node agreeing with the argmax [B, q] all the way from the root (first in
 * level order on ties; -1 none) and its depth; *width = the largest depth. */
static int accept_core(const int64_t *tok, const int64_t *par, const int64_t *dep, const int64_t *starts,
                       int64_t b, int64_t k, const int64_t *arg, int64_t q, int64_t *best, int64_t *length,
                       int64_t *width) {
    char *ok = malloc((size_t)k + 1);
    if (!ok) return E_NOMEM;
    int err = OK;
    *width = 0;
    for (int64_t r = 0; r < b && !err; r++) {
        int64_t lo = starts[r], hi = starts[r + 1], bi = -1, bs = 0;
        if (hi < lo || hi - lo + 1 > q) { err = hi < lo ? E_SHAPE : E_SLOT; break; }
        const int64_t *ar = arg + r * q;
        for (int64_t i = lo; i < hi; i++) {
            int64_t u = par[i];
            if (u >= 0 && (u < lo || u >= i)) { err = E_PARENT; break; }
            ok[i] = tok[i] == ar[u >= 0 ? 1 + u - lo : 0] && (u < 0 || ok[u]);
            int64_t score = ok[i] ? dep[i] : 0;
            if (score > bs) bs = score, bi = i;
        }
        best[r] = bi;
        length[r] = bi >= 0 ? dep[bi] : 0;
        if (length[r] > *width) *width = length[r];
    }
    free(ok);
    return err;
}

/* The accepted paths [B, w] (-1 padded) and their tokens followed by the bonus token [B, w + 1]
 * (0 padded), w >= every length. */
static int fill_core(const int64_t *tok, const int64_t *par, const int64_t *starts, int64_t b, int64_t k,
                     const int64_t *arg, int64_t q, const int64_t *best, const int64_t *length, int64_t *path,
                     int64_t w, int64_t *out) {
    for (int64_t r = 0; r < b; r++) {
        int64_t *pr = path + r * w, *orow = out + r * (w + 1), len = length[r], node = best[r];
        if (len < 0 || len > w || node >= k) return E_SHAPE;
        for (int64_t j = 0; j < w; j++) pr[j] = -1;
        for (int64_t j = 0; j <= w; j++) orow[j] = 0;
        int64_t last = node >= 0 ? 1 + node - starts[r] : 0;
        if (last >= q) return E_SLOT;
        for (int64_t j = len - 1; j >= 0 && node >= 0; j--) {
            pr[j] = node;
            orow[j] = tok[node];
            node = par[node];
        }
        orow[len] = arg[r * q + last];
    }
    return OK;
}

/* How many of each row's accepted tokens + bonus (tokens [B, w1]) to commit: at most remaining,
 * up to and including the first EOS. reason: 0 go on, 1 length, 2 eos (commit_lengths). */
static int cut_core(const int64_t *tok, int64_t w1, const int64_t *len, const int64_t *rem, const int64_t *eos,
                    int64_t ne, int64_t b, int64_t *n, int64_t *reason) {
    for (int64_t r = 0; r < b; r++) {
        if (len[r] < 0 || len[r] + 1 > w1) return E_SHAPE;
        int64_t k = len[r] + 1 < rem[r] ? len[r] + 1 : rem[r];
        int64_t why = k == rem[r] ? 1 : 0;
        const int64_t *t = tok + r * w1;
        for (int64_t j = 0; j < k && ne; j++) {
            int64_t hit = 0;
            for (int64_t e = 0; e < ne; e++) hit |= t[j] == eos[e];
            if (hit) { k = j + 1, why = 2; break; }
        }
        n[r] = k, reason[r] = why;
    }
    return OK;
}

/* The new cache slots each row keeps [B, 1 + w]: its last committed token (slot 0) then its
 * accepted path (slot 1 + local), holes (index 0, not valid) after the path. *prefix: whether
 * the first `wp` columns are 0, 1, ... on every row (a crop keeps the cache right). */
static int compact_core(const int64_t *local, int64_t k, const int64_t *path, int64_t w, const int64_t *len,
                        int64_t b, int64_t wp, int64_t *idx, char *valid, int *prefix) {
    *prefix = 1;
    for (int64_t r = 0; r < b; r++) {
        const int64_t *pr = path + r * w;
        int64_t *ir = idx + r * (w + 1);
        char *vr = valid + r * (w + 1);
        if (len[r] < 0 || len[r] > w) return E_SHAPE;
        ir[0] = 0;
        for (int64_t j = 0; j < w; j++) {
            int64_t node = pr[j];
            if (node >= k) return E_SLOT;
            ir[1 + j] = node >= 0 ? 1 + local[node] : 0;
        }
        for (int64_t j = 0; j <= w; j++) {
            vr[j] = j < 1 + len[r];
            if (j < wp) *prefix &= ir[j] == j;
        }
    }
    return OK;
}

/* The model's token after each merged node's parent [n] (the root: the row's first token), -1
 * where the model did not go through the parent (see decoder.calibration). */
static int after_core(const int64_t *par, int64_t n, const int64_t *starts, int64_t b, const int64_t *km,
                      int64_t k, const int64_t *path, int64_t w, const int64_t *tok, int64_t *out) {
    int64_t *chosen = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!chosen) return E_NOMEM;
    int err = OK;
    for (int64_t i = 0; i < n; i++) chosen[i] = -1;
    for (int64_t r = 0; r < b && !err; r++)
        for (int64_t j = 0; j < w; j++) {
            int64_t node = path[r * w + j];
            if (node < 0) continue;
            if (node >= k || km[node] < 0 || km[node] >= n) { err = E_SLOT; break; }
            chosen[km[node]] = tok[r * (w + 1) + j + 1];
        }
    for (int64_t r = 0; r < b && !err; r++)
        for (int64_t i = starts[r]; i < starts[r + 1]; i++) {
            if (par[i] >= n) { err = E_PARENT; break; }
            out[i] = par[i] >= 0 ? chosen[par[i]] : tok[r * (w + 1)];
        }
    free(chosen);
    return err;
}

/* Calibration.update_rows in place on predicted/hits [S, D, E]; *u = rows updated. Each row with
 * a tested node (after >= 0) decays the sums once, in row order; the additions run source by
 * source, node by node, as numpy's add.at over np.nonzero((raw_p > 0).T) did: bit-identical. */
static int calibrate_core(const int64_t *tok, const int64_t *dep, const int64_t *starts, int64_t b, int64_t n,
                          const double *raw, int64_t S, const int64_t *bins, const int64_t *after, double decay,
                          double *pred, double *hits, int64_t D, int64_t *u_out) {
    int64_t cells = S * D * EVIDENCE_BINS, u = 0;
    double *weight = malloc(sizeof(double) * (size_t)(b + 1));  /* [B] decay ** (rows updating after r) */
    int64_t *row = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int err = OK;
    if (!weight || !row) err = E_NOMEM;
    for (int64_t r = 0; r < b && !err; r++) {
        int64_t any = 0;
        for (int64_t i = starts[r]; i < starts[r + 1]; i++) {
            row[i] = r;
            any |= after[i] >= 0;
        }
        weight[r] = (double)any;  /* mark; turned into the weight below */
        u += any;
    }
    for (int64_t i = 0; i < n * S && !err; i++)
        if (bins[i] < 0 || bins[i] >= EVIDENCE_BINS) err = E_SLOT;
    for (int64_t i = 0; i < n && !err; i++)
        if (dep[i] < 1) err = E_SLOT;  /* merged nodes are >= 1 deep */
    if (!err && u) {
        int64_t seen = 0;
        for (int64_t r = 0; r < b; r++) {
            seen += weight[r] != 0.0;
            weight[r] = pow(decay, (double)(u - seen));
        }
        double f = pow(decay, (double)u);
        for (int64_t c = 0; c < cells; c++) pred[c] *= f;
        for (int64_t c = 0; c < cells; c++) hits[c] *= f;
        for (int64_t s = 0; s < S; s++)
            for (int64_t i = 0; i < n; i++) {
                double p = raw[i * S + s];
                if (after[i] < 0 || !(p > 0)) continue;
                int64_t col = (dep[i] < D ? dep[i] : D) - 1;
                int64_t c = (s * D + col) * EVIDENCE_BINS + bins[i * S + s];
                double w = weight[row[i]];
                pred[c] += p * w;
                hits[c] += (tok[i] == after[i] ? 1.0 : 0.0) * w;
            }
    }
    free(weight);
    free(row);
    *u_out = err ? 0 : u;
    return err;
}

/* accept(tokens, parents, depths, starts, argmax [B, q], best_out [B], length_out [B]) -> width. */
static PyObject *py_accept(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_par, *o_dep, *o_starts, *o_arg, *o_best, *o_len;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o_tok, &o_par, &o_dep, &o_starts, &o_arg, &o_best, &o_len)) return NULL;
    Views vs = {.n = 0};
    int64_t k, k2, k3, b1, na, nb, nl;
    const int64_t *tok, *par, *dep, *starts, *arg;
    int64_t *best, *length;
    if (!(tok = view(&vs, o_tok, 'q', 0, &k, "tokens"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &k2, "parents"))) return fail(&vs);
    if (!(dep = view(&vs, o_dep, 'q', 0, &k3, "depths"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(arg = view(&vs, o_arg, 'q', 0, &na, "argmax"))) return fail(&vs);
    if (!(best = view(&vs, o_best, 'q', 1, &nb, "best"))) return fail(&vs);
    if (!(length = view(&vs, o_len, 'q', 1, &nl, "length"))) return fail(&vs);
    int64_t b = b1 - 1;
    if (k2 != k || k3 != k || b < 0 || nb != b || nl != b || (b && (starts[0] != 0 || starts[b] != k)))
        return raise(&vs, E_SHAPE);
    int64_t q = b ? na / b : 0, width = 0;
    if (na != b * q) return raise(&vs, E_SHAPE);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = accept_core(tok, par, dep, starts, b, k, arg, q, best, length, &width);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return PyLong_FromLongLong(width);
}

/* accept_fill(tokens, parents, starts, argmax [B, q], best, length, path [B, W], out [B, W + 1]). */
static PyObject *py_accept_fill(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_par, *o_starts, *o_arg, *o_best, *o_len, *o_path, *o_out;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o_tok, &o_par, &o_starts, &o_arg, &o_best, &o_len, &o_path, &o_out))
        return NULL;
    Views vs = {.n = 0};
    int64_t k, k2, b1, na, nb, nl, np_, no;
    const int64_t *tok, *par, *starts, *arg, *best, *length;
    int64_t *path, *out;
    if (!(tok = view(&vs, o_tok, 'q', 0, &k, "tokens"))) return fail(&vs);
    if (!(par = view(&vs, o_par, 'q', 0, &k2, "parents"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(arg = view(&vs, o_arg, 'q', 0, &na, "argmax"))) return fail(&vs);
    if (!(best = view(&vs, o_best, 'q', 0, &nb, "best"))) return fail(&vs);
    if (!(length = view(&vs, o_len, 'q', 0, &nl, "length"))) return fail(&vs);
    if (!(path = view(&vs, o_path, 'q', 1, &np_, "path"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'q', 1, &no, "out"))) return fail(&vs);
    int64_t b = b1 - 1;
    if (k2 != k || b < 0 || nb != b || nl != b) return raise(&vs, E_SHAPE);
    int64_t q = b ? na / b : 0, w = b ? np_ / b : 0;
    if (na != b * q || np_ != b * w || no != b * (w + 1)) return raise(&vs, E_SHAPE);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = fill_core(tok, par, starts, b, k, arg, q, best, length, path, w, out);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ after the forward */

/* cut(tokens [B, W + 1], length [B], remaining [B], eos [e], n_out [B], reason_out [B]). */
static PyObject *py_cut(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_len, *o_rem, *o_eos, *o_n, *o_reason;
    if (!PyArg_ParseTuple(args, "OOOOOO", &o_tok, &o_len, &o_rem, &o_eos, &o_n, &o_reason)) return NULL;
    Views vs = {.n = 0};
    int64_t nt, b, br, ne, bn, bz;
    const int64_t *tok, *len, *rem, *eos;
    int64_t *n, *reason;
    if (!(tok = view(&vs, o_tok, 'q', 0, &nt, "tokens"))) return fail(&vs);
    if (!(len = view(&vs, o_len, 'q', 0, &b, "length"))) return fail(&vs);
    if (!(rem = view(&vs, o_rem, 'q', 0, &br, "remaining"))) return fail(&vs);
    if (!(eos = view(&vs, o_eos, 'q', 0, &ne, "eos"))) return fail(&vs);
    if (!(n = view(&vs, o_n, 'q', 1, &bn, "n"))) return fail(&vs);
    if (!(reason = view(&vs, o_reason, 'q', 1, &bz, "reason"))) return fail(&vs);
    int64_t w1 = b ? nt / b : 0;
    if (br != b || bn != b || bz != b || nt != b * w1) return raise(&vs, E_SHAPE);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = cut_core(tok, w1, len, rem, eos, ne, b, n, reason);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* compact(kept_local [k], path [B, W], length [B], idx_out [B, 1 + W], valid_out [B, 1 + W] bool)
 * -> whether idx is 0, 1, ..., W on every row. */
static PyObject *py_compact(PyObject *self, PyObject *args) {
    PyObject *o_local, *o_path, *o_len, *o_idx, *o_valid;
    if (!PyArg_ParseTuple(args, "OOOOO", &o_local, &o_path, &o_len, &o_idx, &o_valid)) return NULL;
    Views vs = {.n = 0};
    int64_t k, np_, b, ni, nv;
    const int64_t *local, *path, *len;
    int64_t *idx;
    char *valid;
    if (!(local = view(&vs, o_local, 'q', 0, &k, "kept_local"))) return fail(&vs);
    if (!(path = view(&vs, o_path, 'q', 0, &np_, "path"))) return fail(&vs);
    if (!(len = view(&vs, o_len, 'q', 0, &b, "length"))) return fail(&vs);
    if (!(idx = view(&vs, o_idx, 'q', 1, &ni, "idx"))) return fail(&vs);
    if (!(valid = view(&vs, o_valid, '?', 1, &nv, "valid"))) return fail(&vs);
    int64_t w = b ? np_ / b : 0;
    if (np_ != b * w || ni != b * (w + 1) || nv != ni) return raise(&vs, E_SHAPE);
    int err, prefix;
    Py_BEGIN_ALLOW_THREADS
    err = compact_core(local, k, path, w, len, b, w + 1, idx, valid, &prefix);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return PyBool_FromLong(prefix);
}

/* credit(sources [n], kept_merged [k], path [B, W], n [B], side_bits, hits_out [B, S] int64 zeroed,
 * only_side_out [B] float64): per row the committed draft tokens each source proposed, and how
 * many only side-branch sources proposed. */
static PyObject *py_credit(PyObject *self, PyObject *args) {
    PyObject *o_src, *o_km, *o_path, *o_n, *o_hits, *o_only;
    long long side;
    if (!PyArg_ParseTuple(args, "OOOOLOO", &o_src, &o_km, &o_path, &o_n, &side, &o_hits, &o_only)) return NULL;
    Views vs = {.n = 0};
    int64_t nm, k, np_, b, nh, bo;
    const int64_t *src, *km, *path, *n;
    int64_t *hits;
    double *only;
    if (!(src = view(&vs, o_src, 'q', 0, &nm, "sources"))) return fail(&vs);
    if (!(km = view(&vs, o_km, 'q', 0, &k, "kept_merged"))) return fail(&vs);
    if (!(path = view(&vs, o_path, 'q', 0, &np_, "path"))) return fail(&vs);
    if (!(n = view(&vs, o_n, 'q', 0, &b, "n"))) return fail(&vs);
    if (!(hits = view(&vs, o_hits, 'q', 1, &nh, "hits"))) return fail(&vs);
    if (!(only = view(&vs, o_only, 'd', 1, &bo, "only_side"))) return fail(&vs);
    int64_t w = b ? np_ / b : 0, S = b ? nh / b : 0;
    if (np_ != b * w || nh != b * S || bo != b || S > 63) return raise(&vs, E_SHAPE);
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < b && !err; r++) {
        double side_only = 0.0;
        for (int64_t j = 0; j < w && j < n[r]; j++) {
            int64_t node = path[r * w + j];
            if (node < 0) continue;
            if (node >= k || km[node] < 0 || km[node] >= nm) { err = E_SLOT; break; }
            int64_t bits = src[km[node]];
            side_only += (bits & side) != 0 && (bits & ~side) == 0;
            for (int64_t s = 0; s < S; s++) hits[r * S + s] += (bits >> s) & 1;
        }
        only[r] = side_only;
    }
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* after(parents [n], starts [B + 1], kept_merged [k], path [B, W], tokens [B, W + 1], out [n]). */
static PyObject *py_after(PyObject *self, PyObject *args) {
    PyObject *o_par, *o_starts, *o_km, *o_path, *o_tok, *o_out;
    if (!PyArg_ParseTuple(args, "OOOOOO", &o_par, &o_starts, &o_km, &o_path, &o_tok, &o_out)) return NULL;
    Views vs = {.n = 0};
    int64_t n, b1, k, np_, nt, no;
    const int64_t *par, *starts, *km, *path, *tok;
    int64_t *out;
    if (!(par = view(&vs, o_par, 'q', 0, &n, "parents"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(km = view(&vs, o_km, 'q', 0, &k, "kept_merged"))) return fail(&vs);
    if (!(path = view(&vs, o_path, 'q', 0, &np_, "path"))) return fail(&vs);
    if (!(tok = view(&vs, o_tok, 'q', 0, &nt, "tokens"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'q', 1, &no, "out"))) return fail(&vs);
    int64_t b = b1 - 1, w = b > 0 ? np_ / b : 0;
    if (b < 0 || no != n || np_ != b * w || nt != b * (w + 1) || (b && (starts[0] != 0 || starts[b] != n)))
        return raise(&vs, E_SHAPE);
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = after_core(par, n, starts, b, km, k, path, w, tok, out);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    Py_RETURN_NONE;
}

/* calibrate(tokens [n], depths [n], starts [B + 1], raw_p [n, S], bins [n, S], after [n], decay,
 * predicted [S, D, E], hits [S, D, E]) -> rows updated (calibrate_core). */
static PyObject *py_calibrate(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_dep, *o_starts, *o_raw, *o_bins, *o_after, *o_pred, *o_hits;
    double decay;
    if (!PyArg_ParseTuple(args, "OOOOOOdOO", &o_tok, &o_dep, &o_starts, &o_raw, &o_bins, &o_after, &decay,
                          &o_pred, &o_hits))
        return NULL;
    Views vs = {.n = 0};
    int64_t n, n2, b1, nr, nb, na, npred, nhits;
    const int64_t *tok, *dep, *starts, *bins, *after;
    const double *raw;
    double *pred, *hits;
    if (!(tok = view(&vs, o_tok, 'q', 0, &n, "tokens"))) return fail(&vs);
    if (!(dep = view(&vs, o_dep, 'q', 0, &n2, "depths"))) return fail(&vs);
    if (!(starts = view(&vs, o_starts, 'q', 0, &b1, "starts"))) return fail(&vs);
    if (!(raw = view(&vs, o_raw, 'd', 0, &nr, "raw_p"))) return fail(&vs);
    if (!(bins = view(&vs, o_bins, 'q', 0, &nb, "bins"))) return fail(&vs);
    if (!(after = view(&vs, o_after, 'q', 0, &na, "after"))) return fail(&vs);
    if (!(pred = view(&vs, o_pred, 'd', 1, &npred, "predicted"))) return fail(&vs);
    if (!(hits = view(&vs, o_hits, 'd', 1, &nhits, "hits"))) return fail(&vs);
    int64_t b = b1 - 1, S = n ? nr / n : 0;
    int64_t cells = S ? npred / S : 0, D = cells / EVIDENCE_BINS;
    if (b < 0 || n2 != n || na != n || nb != nr || nr != n * S || nhits != npred || npred != S * D * EVIDENCE_BINS
        || (n && D < 1) || (b && (starts[0] != 0 || starts[b] != n)))
        return raise(&vs, E_SHAPE);
    int err;
    int64_t u = 0;
    Py_BEGIN_ALLOW_THREADS
    err = calibrate_core(tok, dep, starts, b, n, raw, S, bins, after, decay, pred, hits, D, &u);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return PyLong_FromLongLong(u);
}

/* settle(kept tokens, parents, depths, starts, local, merged, argmax [B, q], remaining [B], eos,
 * calibration | None, path [B, Wa], tokens [B, Wa + 1], length [B], cut [B], reason [B],
 * idx [B, 1 + Wa], valid [B, 1 + Wa] bool) -> (W, crop, rows calibrated): a greedy step's host work
 * after the forward in one call: acceptance (accept + accept_fill), the commit cut (cut), the cache
 * slots kept (compact; crop over the first 1 + W columns, W = the longest path <= Wa) and, when
 * calibration = (merged tokens, parents, depths, starts, raw_p, bins, decay, predicted, hits), the
 * calibration update (after + calibrate). Outputs past column W are padding (-1 paths, 0 tokens,
 * holes). Each was ~5-10 us of numpy and argument handling at batch 1 in the decode loop. */
static PyObject *py_settle(PyObject *self, PyObject *args) {
    PyObject *o_kt, *o_kp, *o_kd, *o_ks, *o_kl, *o_km, *o_arg, *o_rem, *o_eos, *o_cal;
    PyObject *o_path, *o_tok, *o_len, *o_cut, *o_reason, *o_idx, *o_valid;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOO", &o_kt, &o_kp, &o_kd, &o_ks, &o_kl, &o_km, &o_arg, &o_rem,
                          &o_eos, &o_cal, &o_path, &o_tok, &o_len, &o_cut, &o_reason, &o_idx, &o_valid))
        return NULL;
    Views vs = {.n = 0};
    int64_t k, k2, k3, k4, k5, b1, na, br, ne, np_, nt, nl, nc, nr, ni, nv;
    const int64_t *kt, *kp, *kd, *ks, *kl, *km, *arg, *rem, *eos;
    int64_t *path, *tok, *len, *cut, *reason, *idx;
    char *valid;
    if (!(kt = view(&vs, o_kt, 'q', 0, &k, "kept tokens"))) return fail(&vs);
    if (!(kp = view(&vs, o_kp, 'q', 0, &k2, "kept parents"))) return fail(&vs);
    if (!(kd = view(&vs, o_kd, 'q', 0, &k3, "kept depths"))) return fail(&vs);
    if (!(ks = view(&vs, o_ks, 'q', 0, &b1, "kept starts"))) return fail(&vs);
    if (!(kl = view(&vs, o_kl, 'q', 0, &k4, "kept local"))) return fail(&vs);
    if (!(km = view(&vs, o_km, 'q', 0, &k5, "kept merged"))) return fail(&vs);
    if (!(arg = view(&vs, o_arg, 'q', 0, &na, "argmax"))) return fail(&vs);
    if (!(rem = view(&vs, o_rem, 'q', 0, &br, "remaining"))) return fail(&vs);
    if (!(eos = view(&vs, o_eos, 'q', 0, &ne, "eos"))) return fail(&vs);
    if (!(path = view(&vs, o_path, 'q', 1, &np_, "path"))) return fail(&vs);
    if (!(tok = view(&vs, o_tok, 'q', 1, &nt, "tokens"))) return fail(&vs);
    if (!(len = view(&vs, o_len, 'q', 1, &nl, "length"))) return fail(&vs);
    if (!(cut = view(&vs, o_cut, 'q', 1, &nc, "cut"))) return fail(&vs);
    if (!(reason = view(&vs, o_reason, 'q', 1, &nr, "reason"))) return fail(&vs);
    if (!(idx = view(&vs, o_idx, 'q', 1, &ni, "idx"))) return fail(&vs);
    if (!(valid = view(&vs, o_valid, '?', 1, &nv, "valid"))) return fail(&vs);
    int64_t b = b1 - 1;
    if (b < 1 || k2 != k || k3 != k || k4 != k || k5 != k || br != b || nl != b || nc != b || nr != b
        || ks[0] != 0 || ks[b] != k)
        return raise(&vs, E_SHAPE);
    int64_t q = na / b, wa = np_ / b;
    if (na != b * q || np_ != b * wa || nt != b * (wa + 1) || ni != b * (wa + 1) || nv != ni) return raise(&vs, E_SHAPE);
    /* calibration: merged tokens, parents, depths, starts, raw_p, bins, decay, predicted, hits */
    int cal = o_cal != Py_None;
    const int64_t *mt = NULL, *mp = NULL, *md = NULL, *ms = NULL, *mb = NULL;
    const double *raw = NULL;
    double *pred = NULL, *hits = NULL, decay = 1.0;
    int64_t n = 0, S = 0, D = 0;
    if (cal) {
        PyObject *a[9];
        if (!PyArg_ParseTuple(o_cal, "OOOOOOdOO", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &decay, &a[7], &a[8]))
            return fail(&vs);
        int64_t n2, n3, mb1, nraw, nbins, npred, nhits;
        if (!(mt = view(&vs, a[0], 'q', 0, &n, "merged tokens"))) return fail(&vs);
        if (!(mp = view(&vs, a[1], 'q', 0, &n2, "merged parents"))) return fail(&vs);
        if (!(md = view(&vs, a[2], 'q', 0, &n3, "merged depths"))) return fail(&vs);
        if (!(ms = view(&vs, a[3], 'q', 0, &mb1, "merged starts"))) return fail(&vs);
        if (!(raw = view(&vs, a[4], 'd', 0, &nraw, "raw_p"))) return fail(&vs);
        if (!(mb = view(&vs, a[5], 'q', 0, &nbins, "bins"))) return fail(&vs);
        if (!(pred = view(&vs, a[7], 'd', 1, &npred, "predicted"))) return fail(&vs);
        if (!(hits = view(&vs, a[8], 'd', 1, &nhits, "hits"))) return fail(&vs);
        S = n ? nraw / n : 0;
        D = S ? npred / (S * EVIDENCE_BINS) : 0;
        if (n2 != n || n3 != n || mb1 != b1 || nbins != nraw || nraw != n * S || nhits != npred
            || npred != S * D * EVIDENCE_BINS || (n && D < 1) || ms[0] != 0 || ms[b] != n)
            return raise(&vs, E_SHAPE);
    }
    int err = OK, crop = 0;
    int64_t width = 0, u = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t *best = malloc(sizeof(int64_t) * (size_t)b), *after = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!best || !after) err = E_NOMEM;
    if (!err) err = accept_core(kt, kp, kd, ks, b, k, arg, q, best, len, &width);
    if (!err && width > wa) err = E_SHAPE;
    if (!err) err = fill_core(kt, kp, ks, b, k, arg, q, best, len, path, wa, tok);
    if (!err) err = cut_core(tok, wa + 1, len, rem, eos, ne, b, cut, reason);
    if (!err) err = compact_core(kl, k, path, wa, len, b, width + 1, idx, valid, &crop);
    if (!err && cal && n) err = after_core(mp, n, ms, b, km, k, path, wa, tok, after);
    if (!err && cal && n) err = calibrate_core(mt, md, ms, b, n, raw, S, mb, after, decay, pred, hits, D, &u);
    free(best);
    free(after);
    Py_END_ALLOW_THREADS
    if (err) return raise(&vs, err);
    views_release(&vs);
    return Py_BuildValue("LiL", (long long)width, crop, (long long)u);
}

/* factors(hits [S, D, E], predicted [S, D, E], prior, max_factor, out [S, D, E]): Calibration.factors,
 * bit-identical: the bin sums in numpy's pairwise order for E = 8. */
static PyObject *py_factors(PyObject *self, PyObject *args) {
    PyObject *o_hits, *o_pred, *o_out;
    double prior, max_factor;
    if (!PyArg_ParseTuple(args, "OOddO", &o_hits, &o_pred, &prior, &max_factor, &o_out)) return NULL;
    Views vs = {.n = 0};
    int64_t nh, np_, no;
    const double *h, *p;
    double *out;
    if (!(h = view(&vs, o_hits, 'd', 0, &nh, "hits"))) return fail(&vs);
    if (!(p = view(&vs, o_pred, 'd', 0, &np_, "predicted"))) return fail(&vs);
    if (!(out = view(&vs, o_out, 'd', 1, &no, "out"))) return fail(&vs);
    if (np_ != nh || no != nh || nh % EVIDENCE_BINS) return raise(&vs, E_SHAPE);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t c = 0; c < nh; c += EVIDENCE_BINS) {
        const double *a = h + c, *q = p + c;
        double hs = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        double ps = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        double pooled = (hs + prior) / (ps + prior);
        for (int e = 0; e < EVIDENCE_BINS; e++) {
            double f = (a[e] + prior * pooled) / (q[e] + prior);
            out[c + e] = f < 0.0 ? 0.0 : (f > max_factor ? max_factor : f);
        }
    }
    Py_END_ALLOW_THREADS
    views_release(&vs);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------- Token Recycling's table */

/* recycle(tokens [n], topk [n, k'], K, n_tokens, rows, next [(rows + 1) * K]) -> (max token, max
 * successor, written): RecycleDrafter.observe_topk. Row t of the flat table holds t's K successors
 * as row offsets (successor * K), dead (rows * K) where unknown or negative. Positions in order,
 * so a token seen twice keeps its latest top-k; negative tokens are skipped; successors go through
 * int32 as the table always kept them. Nothing is written (written = 0) when a token is >= n_tokens
 * or a successor >= rows: the caller grows the table and calls again. */
static PyObject *py_recycle(PyObject *self, PyObject *args) {
    PyObject *o_tok, *o_top, *o_next;
    long long K, n_tokens, rows;
    if (!PyArg_ParseTuple(args, "OOLLLO", &o_tok, &o_top, &K, &n_tokens, &rows, &o_next)) return NULL;
    Views vs = {.n = 0};
    int64_t n, nt, nn;
    const int64_t *tok, *top;
    int64_t *next;
    if (!(tok = view(&vs, o_tok, 'q', 0, &n, "tokens"))) return fail(&vs);
    if (!(top = view(&vs, o_top, 'q', 0, &nt, "topk"))) return fail(&vs);
    if (!(next = view(&vs, o_next, 'q', 1, &nn, "next"))) return fail(&vs);
    int64_t kk = n ? nt / n : 0, k = kk < K ? kk : K;
    if (K < 1 || rows < 0 || n_tokens > rows || nt != n * kk || nn != (rows + 1) * K) return raise(&vs, E_SHAPE);
    int64_t max_tok = -1, max_succ = -1, written = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < n; i++) {
        if (tok[i] < 0) continue;
        if (tok[i] > max_tok) max_tok = tok[i];
        for (int64_t j = 0; j < K; j++) {
            int64_t v = j < k ? (int64_t)(int32_t)top[i * kk + j] : -1;
            if (v > max_succ) max_succ = v;
        }
    }
    if (max_tok < n_tokens && max_succ < rows) {
        int64_t dead = rows * K;
        for (int64_t i = 0; i < n; i++) {
            if (tok[i] < 0) continue;
            int64_t *row = next + tok[i] * K;
            for (int64_t j = 0; j < K; j++) {
                int64_t v = j < k ? (int64_t)(int32_t)top[i * kk + j] : -1;
                row[j] = v >= 0 ? v * K : dead;
            }
        }
        written = 1;
    }
    Py_END_ALLOW_THREADS
    views_release(&vs);
    return Py_BuildValue("LLi", (long long)max_tok, (long long)max_succ, (int)written);
}

/* ------------------------------------------------------------------ top-k of the logits (CPU) */

/* Whether any of x[0..15] is above t or NaN: four SSE2 compares (not-less-or-equal is true for
 * NaN too) where the compiler targets x86-64, else a plain loop. */
static inline int block_reaches(const float *x, float t) {
#if defined(__SSE2__)
    __m128 tv = _mm_set1_ps(t);
    __m128 a = _mm_cmpnle_ps(_mm_loadu_ps(x), tv), b = _mm_cmpnle_ps(_mm_loadu_ps(x + 4), tv);
    __m128 c = _mm_cmpnle_ps(_mm_loadu_ps(x + 8), tv), d = _mm_cmpnle_ps(_mm_loadu_ps(x + 12), tv);
    return _mm_movemask_ps(_mm_or_ps(_mm_or_ps(a, b), _mm_or_ps(c, d)));
#else
    int m = 0;
    for (int j = 0; j < 16; j++) m |= !(x[j] <= t);
    return m;
#endif
}

/* Inserts (v, i) into the descending top list (vals, idx) [k] if it beats the last; equal values
 * keep the smaller index first (i only grows). */
static inline void top_insert(float *vals, int64_t *idx, int64_t k, float v, int64_t i) {
    if (!(v > vals[k - 1])) return;
    int64_t p = k - 1;
    while (p > 0 && vals[p - 1] < v) {
        vals[p] = vals[p - 1], idx[p] = idx[p - 1];
        p--;
    }
    vals[p] = v, idx[p] = i;
}

/* topk(logits float32 [n, V], out [n, k] int64) -> whether a NaN was found (out is then
 * unspecified; the caller falls back to torch). Per row the k largest logits' indices, largest
 * first, equal values by smaller index: out[:, 0] is argmax's choice. One streaming pass per row
 * (a vectorised test of 16 logits against the k-th best so far), no scratch: torch's CPU topk
 * took ~0.9 ms for 65 x 49,152 logits and left the caches cold for the host work after it. */
static PyObject *py_topk(PyObject *self, PyObject *args) {
    PyObject *o_logits, *o_out;
    if (!PyArg_ParseTuple(args, "OO", &o_logits, &o_out)) return NULL;
    Views vs = {.n = 0};
    Py_buffer *lb = &vs.v[vs.n];
    if (PyObject_GetBuffer(o_logits, lb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return fail(&vs);
    vs.n++;
    const char *f = lb->format ? lb->format : "B";
    while (*f == '<' || *f == '=' || *f == '@') f++;
    if (!(f[0] == 'f' && f[1] == 0 && lb->itemsize == 4)) {
        views_release(&vs);
        PyErr_SetString(PyExc_TypeError, "_step.topk: logits must be a contiguous float32 array");
        return NULL;
    }
    int64_t no, total = (int64_t)(lb->len / 4);
    int64_t *out;
    if (!(out = view(&vs, o_out, 'q', 1, &no, "out"))) return fail(&vs);
    int nd = lb->ndim;
    int64_t V = nd >= 1 ? (int64_t)lb->shape[nd - 1] : 0, n = V ? total / V : 0, k = n ? no / n : 0;
    if (V < 1 || k < 1 || k > 64 || k > V || no != n * k || total != n * V) return raise(&vs, E_SHAPE);
    const float *x = lb->buf;
    int nan = 0;
    Py_BEGIN_ALLOW_THREADS
    float vals[64];
    int64_t idx[64];
    for (int64_t r = 0; r < n && !nan; r++) {
        const float *row = x + r * V;
        for (int64_t j = 0; j < k; j++) vals[j] = -INFINITY, idx[j] = -1;
        int64_t i = 0;
        for (; i < k; i++) {  /* the first k: every one enters (-inf ties: the smaller index stays) */
            if (row[i] != row[i]) { nan = 1; break; }
            int64_t p = i;
            while (p > 0 && vals[p - 1] < row[i]) vals[p] = vals[p - 1], idx[p] = idx[p - 1], p--;
            vals[p] = row[i], idx[p] = i;
        }
        for (; i + 16 <= V && !nan; i += 16) {
            if (!block_reaches(row + i, vals[k - 1])) continue;
            for (int64_t j = i; j < i + 16; j++) {
                if (row[j] != row[j]) { nan = 1; break; }
                top_insert(vals, idx, k, row[j], j);
            }
        }
        for (; i < V && !nan; i++) {
            if (row[i] != row[i]) { nan = 1; break; }
            top_insert(vals, idx, k, row[i], i);
        }
        memcpy(out + r * k, idx, sizeof(int64_t) * (size_t)k);
    }
    Py_END_ALLOW_THREADS
    views_release(&vs);
    return PyBool_FromLong(nan);
}

/* ---------------------------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"merge", py_merge, METH_VARARGS,
     "merge(tokens i32, parents i32 (local), counts, meta [P, 3] (size, row, source), max_depths [B], "
     "smoothing, (factors, D, E) | None, S, out_ints [4, N], raw_p [N, S] zeros, bins [N, S] zeros, "
     "out_floats [2, N], starts [B + 1]) -> merged node count."},
    {"path_products", py_path_products, METH_VARARGS, "path_products(cond_p, parents, out)."},
    {"ranked", py_ranked, METH_VARARGS, "ranked(path_p, starts, out): per row by descending path_p, ties by index."},
    {"select", py_select, METH_VARARGS, "select(path_p, parents, starts, n, order | None, keep_out) -> k."},
    {"kept", py_kept, METH_VARARGS, "kept(tokens, parents, depths, starts, keep, out [5, k], kept_starts [B + 1])."},
    {"width", py_width, METH_VARARGS, "width(starts, m) -> max_r 1 + n_r + m_r."},
    {"inputs", py_inputs, METH_VARARGS,
     "inputs(tokens, parents, depths, starts, roots, bases, m, pad_id, valid, low_bits, full, ids_pos, mask)."},
    {"accept", py_accept, METH_VARARGS, "accept(tokens, parents, depths, starts, argmax, best, length) -> width."},
    {"accept_fill", py_accept_fill, METH_VARARGS,
     "accept_fill(tokens, parents, starts, argmax, best, length, path, out)."},
    {"settle", py_settle, METH_VARARGS,
     "settle(kept tokens, parents, depths, starts, local, merged, argmax, remaining, eos, calibration | None, "
     "path, tokens, length, cut, reason, idx, valid) -> (W, crop, rows calibrated)."},
    {"cut", py_cut, METH_VARARGS, "cut(tokens, length, remaining, eos, n_out, reason_out)."},
    {"compact", py_compact, METH_VARARGS, "compact(kept_local, path, length, idx_out, valid_out) -> prefix."},
    {"credit", py_credit, METH_VARARGS, "credit(sources, kept_merged, path, n, side_bits, hits_out, only_side_out)."},
    {"after", py_after, METH_VARARGS, "after(parents, starts, kept_merged, path, tokens, out)."},
    {"calibrate", py_calibrate, METH_VARARGS,
     "calibrate(tokens, depths, starts, raw_p, bins, after, decay, predicted, hits) -> rows updated."},
    {"factors", py_factors, METH_VARARGS, "factors(hits, predicted, prior, max_factor, out)."},
    {"topk", py_topk, METH_VARARGS, "topk(logits float32 [n, V], out [n, k]) -> NaN found."},
    {"recycle", py_recycle, METH_VARARGS,
     "recycle(tokens, topk, K, n_tokens, rows, next) -> (max token, max successor, written)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "decoder._step",
                                    "Compiled per-step host work of the speculative decoder.", -1, methods};

PyMODINIT_FUNC PyInit__step(void) { return PyModule_Create(&module); }
