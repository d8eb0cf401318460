/* Suffix-array search and exact child splitting for datastore.index (DESIGN.md, "exact weighted
 * trie"). The only implementation of both: datastore/index.py wraps it, and the brute-force tests
 * (tests/test_datastore_*.py) are its reference.
 *
 * A Shard holds read-only buffer views of one index: tokens [n] uint16|uint32, suffix array [n]
 * int32|uint32|int64 and bucket starts [V + 1] int64 (suffixes starting with token v are
 * sa[starts[v]:starts[v + 1]]). The buffers may be zero-copy LMDB pages.
 *
 * split() finds the children of a trie node: the suffixes of the node share their first k tokens,
 * so within each shard's range the token at offset k (its "value") is non-decreasing and every
 * child is a contiguous sub-range. A one-token context matches millions of suffixes, so ranges are
 * never read whole. They are sampled: a token's count is bracketed by its samples (lower bound: the
 * span of its samples; upper bound: the span between its differing neighbours), and a token that no
 * sample shows hides in a gap between two samples whose values differ by >= 2. The cut is
 * max(floor, the keep-th largest lower bound among the siblings and the waiting nodes): a child
 * below it is never popped. Rounds (split_c) sample the hiding gaps more densely and count the
 * likely children exactly, until every token whose upper bound reaches the cut is exact and no
 * unseen token can reach it. On the 107M-token code store a root split of a one-token context
 * (0.03-3.8M suffixes over 4 shards) reads a few thousand of them and takes 0.25-0.8 ms; the
 * previous numpy version took 1.3-7.5 ms.
 *
 * Memory: every value read is a random access into the shard (~100 ns when it misses the cache),
 * so reads are batched: new samples are gathered in two passes (suffix array, then tokens) and the
 * binary searches of a round run in lockstep, so that the CPU overlaps their misses (~20 ns a read).
 *
 * The GIL is released while searching and splitting (the buffers are immutable).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    Py_buffer tok_buf, sa_buf, starts_buf;
    const void *tok;
    const void *sa;
    const int64_t *starts;
    int64_t n, nstarts;
    int tok_size;  /* 2 or 4 (unsigned) */
    int sa_kind;   /* 0: int32, 1: uint32, 2: int64 */
} Shard;

static PyTypeObject ShardType;

/* ------------------------------------------------------------------------------ element access */

static inline int64_t tok_at(const Shard *s, int64_t i) {
    return s->tok_size == 2 ? (int64_t)((const uint16_t *)s->tok)[i]
                            : (int64_t)((const uint32_t *)s->tok)[i];
}

static inline int64_t sa_at(const Shard *s, int64_t p) {
    switch (s->sa_kind) {
    case 0: return (int64_t)((const int32_t *)s->sa)[p];
    case 1: return (int64_t)((const uint32_t *)s->sa)[p];
    default: return ((const int64_t *)s->sa)[p];
    }
}

/* The token at offset k of the suffix at SA position p; -1 past the end. */
static inline int64_t value_at(const Shard *s, int64_t p, int64_t k) {
    int64_t q = sa_at(s, p) + k;
    return q < s->n ? tok_at(s, q) : -1;
}

/* out[i] = value at offset k of the suffixes at positions pos[i], i < cnt. Two passes: every load
 * of a pass is independent of the others, so their cache misses overlap. */
static void gather(const Shard *s, int64_t k, const int64_t *pos, int64_t *out, int64_t cnt) {
    for (int64_t i = 0; i < cnt; i++) out[i] = sa_at(s, pos[i]) + k;
    for (int64_t i = 0; i < cnt; i++) out[i] = out[i] < s->n ? tok_at(s, out[i]) : -1;
}

/* ----------------------------------------------------------------------------------- the Shard */

static int format_ok(const Py_buffer *b, const char *codes, const char *name) {
    const char *f = b->format ? b->format : "B";
    while (*f == '<' || *f == '=' || *f == '@') f++;
    if (b->ndim != 1 || f[0] == 0 || f[1] != 0 || strchr(codes, f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "Shard: %s must be a 1-D buffer of format %s, got %s",
                     name, codes, b->format ? b->format : "B");
        return 0;
    }
    return 1;
}

static int Shard_init(Shard *self, PyObject *args, PyObject *kwds) {
    PyObject *tok, *sa, *starts;
    static char *kwlist[] = {"tokens", "sa", "starts", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO", kwlist, &tok, &sa, &starts)) return -1;
    if (self->tok) {
        PyErr_SetString(PyExc_RuntimeError, "Shard: already initialised");
        return -1;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (PyObject_GetBuffer(tok, &self->tok_buf, flags) < 0) return -1;
    if (PyObject_GetBuffer(sa, &self->sa_buf, flags) < 0) goto fail_tok;
    if (PyObject_GetBuffer(starts, &self->starts_buf, flags) < 0) goto fail_sa;
    if (!format_ok(&self->tok_buf, "HIL", "tokens") || !format_ok(&self->sa_buf, "iIlLq", "sa")
        || !format_ok(&self->starts_buf, "lq", "starts"))
        goto fail_all;
    Py_ssize_t ts = self->tok_buf.itemsize, ss = self->sa_buf.itemsize;
    char sf = self->sa_buf.format[strlen(self->sa_buf.format) - 1];
    if ((ts != 2 && ts != 4) || (ss != 4 && ss != 8) || self->starts_buf.itemsize != 8
        || (ss == 8 && (sf == 'L' || sf == 'Q'))) {
        PyErr_SetString(PyExc_TypeError, "Shard: tokens must be uint16|uint32, sa int32|uint32|int64");
        goto fail_all;
    }
    self->n = self->tok_buf.len / ts;
    if (self->sa_buf.len / ss != self->n) {
        PyErr_SetString(PyExc_ValueError, "Shard: tokens and sa differ in length");
        goto fail_all;
    }
    self->tok_size = (int)ts;
    self->sa_kind = ss == 8 ? 2 : (sf == 'i' || sf == 'l') ? 0 : 1;
    self->nstarts = self->starts_buf.len / 8;
    self->tok = self->tok_buf.buf;
    self->sa = self->sa_buf.buf;
    self->starts = (const int64_t *)self->starts_buf.buf;
    return 0;
fail_all:
    PyBuffer_Release(&self->starts_buf);
fail_sa:
    PyBuffer_Release(&self->sa_buf);
fail_tok:
    PyBuffer_Release(&self->tok_buf);
    self->tok = NULL;
    return -1;
}

static void Shard_dealloc(Shard *self) {
    if (self->tok) {
        PyBuffer_Release(&self->tok_buf);
        PyBuffer_Release(&self->sa_buf);
        PyBuffer_Release(&self->starts_buf);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ShardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "datastore._kernel.Shard",
    .tp_doc = "Shard(tokens, sa, starts): read-only views of one suffix index.",
    .tp_basicsize = sizeof(Shard),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Shard_init,
    .tp_dealloc = (destructor)Shard_dealloc,
};

static const Shard *as_shard(PyObject *o) {
    if (!PyObject_TypeCheck(o, &ShardType) || !((Shard *)o)->tok) {
        PyErr_SetString(PyExc_TypeError, "expected an initialised datastore._kernel.Shard");
        return NULL;
    }
    return (const Shard *)o;
}

/* -------------------------------------------------------------------------------- searching */

/* -1, 0, 1: the first m tokens of the suffix at SA position p against pat (a suffix that ends
 * first is smaller, as in the suffix array's order). */
static inline int compare(const Shard *s, int64_t p, const int64_t *pat, int64_t m) {
    int64_t start = sa_at(s, p);
    for (int64_t j = 0; j < m; j++) {
        if (start + j >= s->n) return -1;
        int64_t t = tok_at(s, start + j);
        if (t != pat[j]) return t < pat[j] ? -1 : 1;
    }
    return 0;
}

/* [*lo, *hi) of the suffixes in [lo, hi) starting with pat; hi < 0 = the whole array, searched
 * from inside the first token's bucket (saves ~5 of ~25 steps). */
static void pattern_range_c(const Shard *s, const int64_t *pat, int64_t m, int64_t *lo, int64_t *hi) {
    int64_t a = *lo, b = *hi < 0 ? s->n : *hi;
    if (m > 0 && *hi < 0) {
        if (pat[0] < 0 || pat[0] >= s->nstarts - 1) {
            *lo = *hi = 0;
            return;
        }
        a = s->starts[pat[0]];
        b = s->starts[pat[0] + 1];
    }
    int64_t top = b;
    while (a < b) {  /* first suffix >= pat; `top` = first seen above every match */
        int64_t mid = a + ((b - a) >> 1);
        int c = compare(s, mid, pat, m);
        if (c < 0) {
            a = mid + 1;
        } else {
            if (c > 0) top = mid;
            b = mid;
        }
    }
    int64_t start = a;
    b = top;
    while (a < b) {
        int64_t mid = a + ((b - a) >> 1);
        if (compare(s, mid, pat, m) <= 0) a = mid + 1;
        else b = mid;
    }
    *lo = start;
    *hi = a;
}

static int occurs_c(const Shard *s, const int64_t *pat, int64_t m) {
    int64_t lo = 0, hi = -1;
    if (m == 0) return s->n > 0;
    if (pat[0] < 0 || pat[0] >= s->nstarts - 1) return 0;
    lo = s->starts[pat[0]];
    hi = s->starts[pat[0] + 1];
    while (lo < hi) {
        int64_t mid = lo + ((hi - lo) >> 1);
        if (compare(s, mid, pat, m) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < s->starts[pat[0] + 1] && compare(s, lo, pat, m) == 0;
}

/* A list/tuple of ints -> malloc'ed int64 array (NULL + exception on error). */
static int64_t *int_array(PyObject *seq, Py_ssize_t *len) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *out = malloc(sizeof(int64_t) * (n ? n : 1));
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (v == -1 && PyErr_Occurred()) {
            free(out);
            Py_DECREF(fast);
            return NULL;
        }
        /* an id beyond int64 occurs nowhere: any out-of-vocabulary stand-in compares the same */
        out[i] = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : (int64_t)v;
    }
    Py_DECREF(fast);
    *len = n;
    return out;
}

static PyObject *py_pattern_range(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *shard, *pattern;
    long long lo = 0, hi = -1;
    if (!PyArg_ParseTuple(args, "OO|LL", &shard, &pattern, &lo, &hi)) return NULL;
    const Shard *s = as_shard(shard);
    if (!s) return NULL;
    Py_ssize_t m;
    int64_t *pat = int_array(pattern, &m);
    if (!pat) return NULL;
    int64_t a = lo, b = hi;
    if (b >= 0 && (a < 0 || b > s->n || a > b)) {
        free(pat);
        PyErr_SetString(PyExc_ValueError, "pattern_range: need 0 <= lo <= hi <= n");
        return NULL;
    }
    if (b >= 0 && a == 0 && b == s->n) b = -1;  /* the whole array: start in the bucket */
    Py_BEGIN_ALLOW_THREADS
    pattern_range_c(s, pat, m, &a, &b);
    Py_END_ALLOW_THREADS
    free(pat);
    return Py_BuildValue("(LL)", (long long)a, (long long)b);
}

/* Shards of a tuple/list -> malloc'ed array of pointers. */
static const Shard **shard_array(PyObject *seq, Py_ssize_t *len) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of Shard");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const Shard **out = malloc(sizeof(Shard *) * (n ? n : 1));
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = as_shard(PySequence_Fast_GET_ITEM(fast, i));
        if (!out[i]) {
            free(out);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);  /* the caller's sequence keeps the shards alive */
    *len = n;
    return out;
}

static PyObject *ranges_tuple(const int64_t *lo, const int64_t *hi, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = Py_BuildValue("(LL)", (long long)lo[i], (long long)hi[i]);
        if (!r) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, r);
    }
    return t;
}

/* longest_match(shards, tail, min_suffix) -> (L, ranges): the longest L in [min_suffix, len(tail)]
 * whose suffix of tail occurs in any shard, by bisection (a suffix of length L occurs wherever one
 * of length L + 1 does); (0, ()) when none does. */
static PyObject *py_longest_match(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *shards_o, *tail_o;
    long long min_suffix;
    if (!PyArg_ParseTuple(args, "OOL", &shards_o, &tail_o, &min_suffix)) return NULL;
    Py_ssize_t ns, m;
    const Shard **sh = shard_array(shards_o, &ns);
    if (!sh) return NULL;
    int64_t *tail = int_array(tail_o, &m);
    if (!tail) {
        free(sh);
        return NULL;
    }
    int64_t *lo = calloc(ns ? ns : 1, sizeof(int64_t)), *hi = calloc(ns ? ns : 1, sizeof(int64_t));
    if (!lo || !hi) {
        free(sh), free(tail), free(lo), free(hi);
        return PyErr_NoMemory();
    }
    int64_t best = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t a = min_suffix < 1 ? 1 : min_suffix, b = m;
    while (a <= b) {
        int64_t mid = a + ((b - a) >> 1), found = 0;
        for (Py_ssize_t i = 0; i < ns && !found; i++)
            found = sh[i]->n > 0 && occurs_c(sh[i], tail + m - mid, mid);
        if (found) best = mid, a = mid + 1;
        else b = mid - 1;
    }
    for (Py_ssize_t i = 0; best && i < ns; i++) {
        hi[i] = -1;
        if (sh[i]->n > 0) pattern_range_c(sh[i], tail + m - best, best, &lo[i], &hi[i]);
        else hi[i] = 0;
    }
    Py_END_ALLOW_THREADS
    PyObject *ranges = ranges_tuple(lo, hi, best ? ns : 0);
    free(sh), free(tail), free(lo), free(hi);
    if (!ranges) return NULL;
    return Py_BuildValue("(LN)", (long long)best, ranges);
}

/* ---------------------------------------------------------------------------------- splitting */

typedef struct {
    int64_t value, first, last;  /* the run's value, its first and last sample */
    int64_t low, high;           /* bounds of its count: its samples' span, its neighbours' */
    int64_t gap;                 /* unsampled positions between the previous run and this one */
} Run;

typedef struct {  /* one live shard's range and its samples, positions ascending */
    const Shard *sh;
    int64_t lo, hi;
    int64_t *pos, *val, m;  /* [m]; pos[0] == lo, pos[m - 1] == hi - 1 */
    int64_t cap;            /* of pos and val; the buffers below are kept across splits too */
    int64_t *pos2, *val2, cap2;  /* spare pos and val: insert_samples merges into them, then swaps */
    int64_t *nv, nvcap;     /* new samples' values */
    Run *run;               /* [runs] runs of equal values */
    int64_t runs, rcap;
} Samples;

typedef struct {
    int64_t token, low, high;  /* bounds of its count summed over shards */
} Cand;

typedef struct {  /* the first p in [a, b) whose value is >= t (> t if strict); b if none */
    Samples *S;
    int64_t a, b, t;
    int strict;
} Search;

typedef struct {
    int64_t k, seplim, keep, floor, samples, density;  /* in */
    const int64_t *waiting;  /* [nwait] descending counts of the nodes waiting in the heap */
    int64_t nwait;
    int live;
    Cand *cand;              /* this round's candidates, ascending tokens */
    int64_t ncand;
    int64_t *scratch;
    int64_t scap;
    int64_t *np, npcap;      /* scratch: new sample positions */
    int64_t *at, *idx, acap; /* scratch of search_all */
    int64_t *surv, survcap;  /* scratch of split_c */
    void *q;                 /* scratch of count_exactly: Search [qcap] */
    int64_t qcap;
    int64_t cut, est;        /* the proven cut, and where it will likely end up */
    int64_t unseen;          /* most occurrences a token no sample shows can have, over shards */
    int64_t widest;          /* the widest gap that could hide a token, in any shard */
    int64_t nkids;           /* out: cand[:nkids] = the children, best first */
} Split;

static int grow(int64_t **a, int64_t *cap, int64_t need) {
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    int64_t *p = realloc(*a, sizeof(int64_t) * c);
    if (!p) return 0;
    *a = p;
    *cap = c;
    return 1;
}

/* Grows two int64 arrays of one capacity to hold `need`, keeping their contents. */
static int grow2(int64_t **a, int64_t **b, int64_t *cap, int64_t need) {
    if (need <= *cap) return 1;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    int64_t *p = realloc(*a, sizeof(int64_t) * c);
    if (!p) return 0;
    *a = p;
    p = realloc(*b, sizeof(int64_t) * c);
    if (!p) return 0;
    *b = p;
    *cap = c;
    return 1;
}

static int cmp_asc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_desc(const void *a, const void *b) { return cmp_asc(b, a); }

static int cmp_child(const void *a, const void *b) {  /* larger count first, then smaller token */
    const Cand *x = a, *y = b;
    if (x->low != y->low) return x->low > y->low ? -1 : 1;
    return (x->token > y->token) - (x->token < y->token);
}

/* The r-th largest of v [n] (reordered), 0 when n < r. */
static int64_t rth_largest(int64_t *v, int64_t n, int64_t r) {
    if (r <= 0 || n < r) return 0;
    int64_t a = 0, b = n - 1, want = r - 1;  /* its index in descending order */
    while (b - a > 16) {  /* quickselect, descending */
        int64_t mid = a + ((b - a) >> 1), x = v[a], y = v[mid], z = v[b];
        int64_t pivot = (x < y) ? ((y < z) ? y : (x < z ? z : x)) : ((x < z) ? x : (y < z ? z : y));
        int64_t i = a, j = b;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                int64_t tmp = v[i];
                v[i] = v[j], v[j] = tmp;
                i++, j--;
            }
        }
        if (want <= j) b = j;
        else if (want >= i) a = i;
        else return v[want];
    }
    qsort(v + a, (size_t)(b - a + 1), sizeof(int64_t), cmp_desc);
    return v[want];
}

/* Groups the samples of S into runs of equal values, with the bounds of each run's count and the
 * gap before it; -> the widest gap that could hide a token (neighbours differ by >= 2), -1 on
 * memory error. */
static int64_t runs_of(Samples *S) {
    if (S->m > S->rcap) {
        Run *r = realloc(S->run, sizeof(Run) * 2 * S->m);
        if (!r) return -1;
        S->run = r, S->rcap = 2 * S->m;
    }
    Run *run = S->run;
    int64_t n = 0, widest = 0;
    for (int64_t j = 0; j < S->m; j++) {
        if (n && run[n - 1].value == S->val[j]) run[n - 1].last = j;
        else run[n++] = (Run){S->val[j], j, j, 0, 0, 0};
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t f = run[r].first, l = run[r].last;
        int64_t before = f > 0 ? S->pos[f - 1] : S->lo - 1;
        int64_t after = l + 1 < S->m ? S->pos[l + 1] : S->hi;
        run[r].low = S->pos[l] - S->pos[f] + 1;
        run[r].high = after - before - 1;
        run[r].gap = r > 0 ? S->pos[f] - before - 1 : 0;
        if (r > 0 && run[r].value - run[r - 1].value >= 2 && run[r].gap > widest) widest = run[r].gap;
    }
    S->runs = n;
    return widest;
}

/* This round's candidates (every valid sampled token, ascending) with bounds summed over shards;
 * cut, est, unseen and widest. A token that no sample of shard i shows has at most the gap it
 * falls in there: `hidden` keeps the sum of those gaps over shards as the merge walks the tokens
 * up, so each token costs O(its runs), not O(shards). */
static int candidates(Split *sp, Samples *S) {
    int live = sp->live;
    int64_t total = 0;
    sp->unseen = sp->widest = 0;
    for (int i = 0; i < live; i++) {
        int64_t widest = runs_of(&S[i]);
        if (widest < 0) return 0;
        total += S[i].runs;
        sp->unseen += widest;
        if (widest > sp->widest) sp->widest = widest;
    }
    Cand *c = realloc(sp->cand, sizeof(Cand) * (total + 1));
    if (!c) return 0;
    sp->cand = c;
    if (!grow(&sp->scratch, &sp->scap, 2 * live + total + sp->nwait + 1)) return 0;
    int64_t *at = sp->scratch;          /* at[i]: shard i's first run with value >= the token */
    int64_t *gap = sp->scratch + live;  /* gap[i]: the gap a token before that run falls in */
    int64_t hidden = 0;
    for (int i = 0; i < live; i++) at[i] = gap[i] = 0;
    sp->ncand = 0;
    for (;;) {  /* merge the shards' ascending runs */
        int64_t t = INT64_MAX;
        for (int i = 0; i < live; i++)
            if (at[i] < S[i].runs && S[i].run[at[i]].value < t) t = S[i].run[at[i]].value;
        if (t == INT64_MAX) break;
        int64_t low = 0, high = hidden;
        for (int i = 0; i < live; i++) {
            if (at[i] >= S[i].runs || S[i].run[at[i]].value != t) continue;
            const Run *r = &S[i].run[at[i]++];
            low += r->low, high += r->high - gap[i];
            int64_t next = at[i] < S[i].runs ? S[i].run[at[i]].gap : 0;
            hidden += next - gap[i], gap[i] = next;
        }
        if (t >= 0 && t < sp->seplim) c[sp->ncand++] = (Cand){t, low, high};
    }
    /* cut: the keep-th best lower bound among the siblings and the waiting nodes; est: the same
     * with the midpoints of the bounds */
    int64_t *v = sp->scratch + 2 * live, nv = 0, nw = sp->nwait < sp->keep ? sp->nwait : sp->keep;
    for (int64_t j = 0; j < sp->ncand; j++) v[nv++] = c[j].low;
    for (int64_t j = 0; j < nw; j++) v[nv++] = sp->waiting[j];
    int64_t kth = rth_largest(v, nv, sp->keep);
    sp->cut = sp->floor > kth ? sp->floor : kth;
    if (sp->cut < 1) sp->cut = 1;
    nv = 0;
    for (int64_t j = 0; j < sp->ncand; j++) v[nv++] = (c[j].low + c[j].high) / 2;
    for (int64_t j = 0; j < nw; j++) v[nv++] = sp->waiting[j];
    sp->est = rth_largest(v, nv, sp->keep);
    if (sp->est < sp->cut) sp->est = sp->cut;
    return 1;
}

/* Sorts v [n] ascending by insertion: the callers' positions come (nearly) sorted, and qsort's
 * comparison calls cost ~100 ns an element. */
static void sort_nearly_sorted(int64_t *v, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        int64_t x = v[i], j = i;
        while (j > 0 && v[j - 1] > x) v[j] = v[j - 1], j--;
        v[j] = x;
    }
}

/* Adds the samples np [cnt] (nearly ascending; those already there are skipped) to S. */
static int insert_samples(const Split *sp, Samples *S, int64_t *np, int64_t cnt) {
    sort_nearly_sorted(np, cnt);
    int64_t u = 0, j = 0;
    for (int64_t x = 0; x < cnt; x++) {
        int64_t p = np[x];
        if (u && np[u - 1] == p) continue;
        while (j < S->m && S->pos[j] < p) j++;
        if (j < S->m && S->pos[j] == p) continue;
        np[u++] = p;
    }
    if (!u) return 1;
    int64_t m2 = S->m + u;
    if (!grow(&S->nv, &S->nvcap, u) || !grow2(&S->pos2, &S->val2, &S->cap2, m2)) return 0;
    int64_t *nv = S->nv, *pos2 = S->pos2, *val2 = S->val2;
    gather(S->sh, sp->k, np, nv, u);
    int64_t a = 0, b = 0;
    for (int64_t o = 0; o < m2; o++) {
        if (b >= u || (a < S->m && S->pos[a] < np[b])) pos2[o] = S->pos[a], val2[o] = S->val[a++];
        else pos2[o] = np[b], val2[o] = nv[b++];
    }
    S->pos2 = S->pos, S->val2 = S->val, S->pos = pos2, S->val = val2;  /* swap the buffers */
    int64_t c = S->cap;
    S->cap = S->cap2, S->cap2 = c, S->m = m2;
    return 1;
}

/* Samples every `stride` positions inside the gaps of S that could hide a token (neighbours
 * differ by >= 2) and are at least `stride` wide; -> samples asked for, -1 on memory error. */
static int64_t hunt(Split *sp, Samples *S, int64_t stride) {
    int64_t n = 0;
    for (int64_t r = 1; r < S->runs; r++) {
        const Run *run = &S->run[r];
        if (run->value - run[-1].value < 2 || run->gap < stride) continue;
        int64_t a = S->pos[run[-1].last], b = S->pos[run->first], q = run->gap / stride;  /* >= 1 */
        if (!grow(&sp->np, &sp->npcap, n + q)) return -1;
        for (int64_t x = 1; x <= q; x++) sp->np[n++] = a + x * (b - a) / (q + 1);
    }
    return insert_samples(sp, S, sp->np, n) ? n : -1;
}

/* Samples the hiding gaps of every shard at `stride`; -> samples asked for, -1 on memory error. */
static int64_t hunt_all(Split *sp, Samples *S, int64_t stride) {
    int64_t added = 0;
    for (int i = 0; i < sp->live; i++) {
        int64_t a = hunt(sp, &S[i], stride < 1 ? 1 : stride);
        if (a < 0) return -1;
        added += a;
    }
    return added;
}

/* Runs the searches q [nq] in lockstep: every step's loads are independent, so their cache misses
 * overlap instead of following one another. */
static int search_all(Split *sp, Search *q, int64_t nq) {
    if (!grow2(&sp->at, &sp->idx, &sp->acap, nq + 1)) return 0;
    int64_t *at = sp->at, *idx = sp->idx;
    for (;;) {
        int64_t act = 0;
        for (int64_t x = 0; x < nq; x++)
            if (q[x].a < q[x].b) idx[act++] = x;
        if (!act) break;
        for (int64_t j = 0; j < act; j++) {
            Search *s = &q[idx[j]];
            at[j] = sa_at(s->S->sh, s->a + ((s->b - s->a) >> 1)) + sp->k;
        }
        for (int64_t j = 0; j < act; j++) {
            Search *s = &q[idx[j]];
            int64_t mid = s->a + ((s->b - s->a) >> 1);
            int64_t v = at[j] < s->S->sh->n ? tok_at(s->S->sh, at[j]) : -1;
            if (v > s->t || (v == s->t && !s->strict)) s->b = mid;
            else s->a = mid + 1;
        }
    }
    return 1;
}

/* Makes the counts of tokens surv [ns] (ascending) exact: binary searches for their boundaries
 * inside the gaps next to their samples (or the gap they may hide in), then samples on both sides
 * of every boundary, which closes those gaps. */
static int count_exactly(Split *sp, Samples *S, const int64_t *surv, int64_t ns) {
    int64_t need = 2 * ns * sp->live + 1;
    if (need > sp->qcap) {
        void *p = realloc(sp->q, sizeof(Search) * need);
        if (!p) return 0;
        sp->q = p, sp->qcap = need;
    }
    Search *q = sp->q;
    int64_t nq = 0;
    for (int i = 0; i < sp->live; i++) {
        Samples *X = &S[i];
        int64_t r = 0;
        for (int64_t x = 0; x < ns; x++) {
            int64_t t = surv[x];
            while (r < X->runs && X->run[r].value < t) r++;
            if (r < X->runs && X->run[r].value == t) {
                int64_t f = X->run[r].first, l = X->run[r].last;
                if (f > 0 && X->pos[f] - X->pos[f - 1] > 1)
                    q[nq++] = (Search){X, X->pos[f - 1] + 1, X->pos[f], t, 0};
                if (l + 1 < X->m && X->pos[l + 1] - X->pos[l] > 1)
                    q[nq++] = (Search){X, X->pos[l] + 1, X->pos[l + 1], t, 1};
            } else if (r > 0 && r < X->runs && X->run[r].gap > 0) {
                int64_t a = X->pos[X->run[r - 1].last] + 1, b = X->pos[X->run[r].first];
                q[nq++] = (Search){X, a, b, t, 0};
                q[nq++] = (Search){X, a, b, t, 1};
            }
        }
    }
    int ok = search_all(sp, q, nq) && grow(&sp->np, &sp->npcap, 2 * nq + 1);
    for (int i = 0; ok && i < sp->live; i++) {
        int64_t n = 0;
        for (int64_t x = 0; x < nq; x++)
            if (q[x].S == &S[i]) sp->np[n++] = q[x].a - 1, sp->np[n++] = q[x].a;
        ok = insert_samples(sp, &S[i], sp->np, n);
    }
    return ok;
}

static int first_samples(Split *sp, Samples *S) {
    int live = sp->live;
    for (int i = 0; i < live; i++) {
        int64_t w = S[i].hi - S[i].lo;
        /* gaps < floor / live hide nothing worth it in total; `density` samples per shard for a
         * child at the floor keep the upper bounds of smaller tokens under it */
        int64_t stride = (w + sp->samples - 1) / sp->samples;
        if (stride < sp->floor / (live * sp->density)) stride = sp->floor / (live * sp->density);
        if (stride < 1) stride = 1;
        int64_t m = (w - 1) / stride + 1 + ((w - 1) % stride != 0);
        if (!grow2(&S[i].pos, &S[i].val, &S[i].cap, m)) return 0;
        int64_t j = 0;
        for (int64_t p = S[i].lo; p < S[i].hi; p += stride) S[i].pos[j++] = p;
        if (S[i].pos[j - 1] != S[i].hi - 1) S[i].pos[j++] = S[i].hi - 1;
        S[i].m = j;
        gather(S[i].sh, sp->k, S[i].pos, S[i].val, j);
    }
    return 1;
}

/* Tokens not yet exact whose upper bound reaches the cut, ascending, into out; likely = only those
 * whose upper bound reaches the estimated cut. -> how many. */
static int64_t survivors(const Split *sp, int64_t *out, int likely) {
    int64_t n = 0;
    for (int64_t j = 0; j < sp->ncand; j++) {
        const Cand *c = &sp->cand[j];
        if (c->high >= sp->cut && c->high > c->low && (!likely || c->high >= sp->est))
            out[n++] = c->token;
    }
    return n;
}

/* Hiding gaps this many strides wide are sampled even when no unseen token can reach the cut:
 * their neighbours' upper bounds would reach it and cost exact counts (A/B on the code store:
 * mean thread CPU per draft 0.380 ms vs 0.408 without). */
#define HUNT_WIDE 2

/* The split itself, no Python objects. Each round computes the candidates and their bounds from
 * the samples, then does the first of:
 * 1. while an unseen token could reach the cut (or a hiding gap is HUNT_WIDE strides wide),
 *    sample the hiding gaps at a stride of est / (live * density): `density` samples per shard
 *    for a child at the estimated cut, so that the estimates firm up and small tokens' upper
 *    bounds drop below the cut (and at most 1/16 of the widest hiding gap, so that they shrink
 *    geometrically);
 * 2. exact counts for the likely children (upper bound >= est): they lift the cut;
 * 3. while an unseen token could still reach the cut, sample the hiding gaps at cut / live (gaps
 *    narrower than that hide fewer than cut occurrences in total);
 * 4. exact counts for every other token whose upper bound reaches the cut.
 * With nothing to do, every token that can make the cut is counted exactly and no other can. */
static int split_c(Split *sp, Samples *S) {
    if (!first_samples(sp, S)) return 0;
    for (;;) {
        if (!candidates(sp, S) || !grow(&sp->surv, &sp->survcap, sp->ncand + 1)) return 0;
        int64_t *surv = sp->surv, added = 0, ns;
        int hunting = sp->unseen >= sp->cut;
        int64_t stride = sp->est / (sp->live * sp->density);
        if (stride < sp->widest / 16) stride = sp->widest / 16;
        int wide = sp->widest >= HUNT_WIDE * stride;
        if ((hunting || wide) && (added = hunt_all(sp, S, stride)) != 0) {
            if (added < 0) return 0;
            continue;
        }
        if ((ns = survivors(sp, surv, 1)) != 0) {
            if (!count_exactly(sp, S, surv, ns)) return 0;
            continue;
        }
        if (hunting && (added = hunt_all(sp, S, sp->cut / sp->live)) != 0) {
            if (added < 0) return 0;
            continue;
        }
        if ((ns = survivors(sp, surv, 0)) == 0) break;
        if (!count_exactly(sp, S, surv, ns)) return 0;
    }
    int64_t n = 0;  /* every candidate whose upper bound reaches the cut is exact now */
    for (int64_t j = 0; j < sp->ncand; j++)
        if (sp->cand[j].low >= sp->cut) sp->cand[n++] = sp->cand[j];
    qsort(sp->cand, (size_t)n, sizeof(Cand), cmp_child);
    sp->nkids = n < sp->keep ? n : sp->keep;
    return 1;
}

/* The child's range in one shard: its run of samples (exact by now), or empty. */
static void child_range(const Samples *S, int64_t t, int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = S->runs;
    while (a < b) {
        int64_t mid = (a + b) >> 1;
        if (S->run[mid].value < t) a = mid + 1;
        else b = mid;
    }
    if (a < S->runs && S->run[a].value == t) {
        *lo = S->pos[S->run[a].first];
        *hi = S->pos[S->run[a].last] + 1;
    } else {
        *lo = *hi = 0;
    }
}

/* ------------------------------------------------------------------- one split, reused buffers */

typedef struct {  /* the buffers every split of one call reuses */
    Split sp;         /* cand and scratch persist; the rest is set per split */
    Samples *S;       /* [nsh + 1]: run buffers persist */
    int *live_of;     /* [nsh + 1] */
    int64_t *kr;      /* out: the children's ranges, [nkids][nsh][lo, hi] */
    int64_t krcap;
    Py_ssize_t nsh;
} Splitter;

static int splitter_init(Splitter *w, Py_ssize_t nsh) {
    memset(w, 0, sizeof(*w));
    w->nsh = nsh;
    w->S = calloc(nsh + 1, sizeof(Samples));
    w->live_of = malloc(sizeof(int) * (nsh + 1));
    return w->S && w->live_of;
}

static void splitter_free(Splitter *w) {
    for (Py_ssize_t i = 0; w->S && i <= w->nsh; i++) {
        Samples *X = &w->S[i];
        free(X->pos), free(X->val), free(X->pos2), free(X->val2), free(X->nv), free(X->run);
    }
    free(w->S), free(w->live_of), free(w->kr), free(w->sp.cand), free(w->sp.scratch);
    free(w->sp.np), free(w->sp.at), free(w->sp.idx), free(w->sp.surv), free(w->sp.q);
    memset(w, 0, sizeof(*w));
}

/* The children of the node whose suffixes are rng [nsh][lo, hi] (ranges inside their shards), all
 * of which share their first k tokens: w->sp.cand[:w->sp.nkids] (token, count in .low), best
 * first, and their ranges in w->kr; w->sp.cut is the cut (see py_split). -> 0 on memory error. */
static int split_node(Splitter *w, const Shard **sh, const int64_t *rng, int64_t k, int64_t seplim,
                      int64_t keep, int64_t floor, const int64_t *waiting, int64_t nwait,
                      int64_t samples, int64_t density) {
    Split *sp = &w->sp;
    Samples *S = w->S;
    Py_ssize_t nsh = w->nsh;
    sp->k = k, sp->seplim = seplim, sp->keep = keep, sp->floor = floor;
    sp->samples = samples, sp->density = density, sp->waiting = waiting, sp->nwait = nwait;
    sp->nkids = sp->ncand = 0;
    int live = 0;
    int64_t width = 0;
    for (Py_ssize_t i = 0; i < nsh; i++) {
        int64_t lo = rng[2 * i], hi = rng[2 * i + 1];
        w->live_of[i] = -1;
        if (hi <= lo) continue;
        w->live_of[i] = live;
        Samples *X = &S[live++];
        X->sh = sh[i], X->lo = lo, X->hi = hi;
        X->m = X->runs = 0;  /* its buffers are kept for reuse (whichever shard had them) */
        width += hi - lo;
    }
    sp->live = live;
    sp->cut = floor > 1 ? floor : 1;
    int ok = 1;
    if (live && width >= sp->cut) ok = split_c(sp, S);
    if (ok && sp->nkids) {
        ok = grow(&w->kr, &w->krcap, sp->nkids * 2 * nsh);
        for (int64_t j = 0; ok && j < sp->nkids; j++) {
            int64_t *r = w->kr + j * 2 * nsh;
            for (Py_ssize_t i = 0; i < nsh; i++) {
                r[2 * i] = r[2 * i + 1] = 0;
                if (w->live_of[i] >= 0) child_range(&S[w->live_of[i]], sp->cand[j].token, &r[2 * i], &r[2 * i + 1]);
            }
        }
    }
    return ok;
}

static PyObject *ranges_pairs(const int64_t *r, Py_ssize_t n) {  /* [n][lo, hi] -> ((lo, hi), ...) */
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = Py_BuildValue("(LL)", (long long)r[2 * i], (long long)r[2 * i + 1]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* split(shards, ranges, k, seplim, keep, floor, waiting, samples, density) -> (children, cut)
 * children: [(token, count, (k + 1, child ranges, count))], larger count first, then smaller token:
 * the best `keep` of those with count >= cut. A child below the cut is below floor or outranked by
 * keep siblings or waiting nodes (waiting: descending counts). samples: first samples per range;
 * density: samples per likely child when hunting for unseen tokens. */
static PyObject *py_split(PyObject *self, PyObject *args) {
    PyObject *shards_o, *ranges_o, *waiting_o;
    long long k, seplim, keep, floor, samples, density;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOLLLLOLL", &shards_o, &ranges_o, &k, &seplim, &keep, &floor,
                          &waiting_o, &samples, &density))
        return NULL;
    if (samples < 1 || density < 1 || keep < 1 || k < 0) {
        PyErr_SetString(PyExc_ValueError, "split: need samples >= 1, density >= 1, keep >= 1, k >= 0");
        return NULL;
    }
    Py_ssize_t nsh, nw;
    const Shard **sh = shard_array(shards_o, &nsh);
    if (!sh) return NULL;
    PyObject *rfast = PySequence_Fast(ranges_o, "split: ranges must be a sequence of (lo, hi)");
    int64_t *waiting = rfast ? int_array(waiting_o, &nw) : NULL;
    int64_t *rng = malloc(sizeof(int64_t) * (2 * nsh + 2));
    PyObject *result = NULL;
    Splitter w;
    int winit = splitter_init(&w, nsh);
    if (!rfast || !waiting || !rng || !winit) {
        if (rfast && waiting) PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(rfast) != nsh) {
        PyErr_SetString(PyExc_ValueError, "split: one range per shard");
        goto done;
    }
    for (Py_ssize_t i = 0; i < nsh; i++) {
        long long lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(rfast, i), "LL", &lo, &hi)) goto done;
        if (hi > lo && (lo < 0 || hi > sh[i]->n)) {
            PyErr_SetString(PyExc_ValueError, "split: a range lies outside its shard");
            goto done;
        }
        rng[2 * i] = lo, rng[2 * i + 1] = hi;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = split_node(&w, sh, rng, k, seplim, keep, floor, waiting, nw, samples, density);
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *kids = PyList_New(w.sp.nkids);
    for (int64_t j = 0; kids && j < w.sp.nkids; j++) {
        const Cand *c = &w.sp.cand[j];
        PyObject *ranges = ranges_pairs(w.kr + j * 2 * nsh, nsh);
        PyObject *item = ranges ? Py_BuildValue("(LL(LNL))", (long long)c->token, (long long)c->low,
                                                (long long)(k + 1), ranges, (long long)c->low)
                                : NULL;
        if (!item) {
            Py_CLEAR(kids);
            break;
        }
        PyList_SET_ITEM(kids, j, item);
    }
    if (kids) result = Py_BuildValue("(NL)", kids, (long long)w.sp.cut);
done:
    splitter_free(&w);
    free(rng), free(waiting), free(sh);
    Py_XDECREF(rfast);
    return result;
}

/* ------------------------------------------------------------------------------------ drafting */

/* The whole draft of datastore.index.draft_from in C: barrier, longest match by bisection,
 * min_count backoff, then the best-first expansion of the trie. Nodes pop by larger count, then
 * smaller token, then discovery order (datastore.tree.expand_best_first's order), until `budget`
 * nodes or `max_depth`. The expansion mirrors the `left` (pops still to come) best counts waiting
 * in its heap (the "frontier"): a child that ranks below `left` of them, or below `left` of its
 * siblings, can never be popped, so the split neither needs nor computes it. */

typedef struct {
    int64_t count, token, seq, roff;  /* roff: its children's ranges, pool[roff : roff + 2 nsh] */
    int32_t parent, depth;            /* depth 1 = a child of the context */
} HNode;

typedef struct {  /* one drafting thread's state, reused over the contexts of a batch */
    Splitter w;
    const Shard **sh;
    Py_ssize_t nsh;
    int64_t seplim, samples, density;
    HNode *heap;
    int64_t nheap, hcap;
    int64_t *pool, npool, pcap;   /* ranges of the nodes pushed in this draft */
    int64_t *top, ntop, tcap;     /* the frontier: best waiting counts, descending */
    int64_t *tmp, tmpcap;
    int64_t *rng, *found;         /* [nsh][lo, hi] */
    int32_t *otok, *opar;         /* out: every tree, concatenated */
    int64_t *ocnt, nout, ocap;
} Drafter;

static int drafter_init(Drafter *d, const Shard **sh, Py_ssize_t nsh, int64_t seplim,
                        int64_t samples, int64_t density) {
    memset(d, 0, sizeof(*d));
    d->sh = sh, d->nsh = nsh, d->seplim = seplim, d->samples = samples, d->density = density;
    d->rng = malloc(sizeof(int64_t) * (2 * nsh + 2));
    d->found = malloc(sizeof(int64_t) * (2 * nsh + 2));
    return splitter_init(&d->w, nsh) && d->rng && d->found;
}

static void drafter_free(Drafter *d) {
    splitter_free(&d->w);
    free(d->heap), free(d->pool), free(d->top), free(d->tmp), free(d->rng), free(d->found);
    free(d->otok), free(d->opar), free(d->ocnt);
}

static inline int hless(const HNode *a, const HNode *b) {  /* a pops before b */
    if (a->count != b->count) return a->count > b->count;
    if (a->token != b->token) return a->token < b->token;
    return a->seq < b->seq;
}

static int heap_push(Drafter *d, HNode x) {
    if (d->nheap == d->hcap) {
        int64_t c = d->hcap ? 2 * d->hcap : 64;
        HNode *h = realloc(d->heap, sizeof(HNode) * c);
        if (!h) return 0;
        d->heap = h, d->hcap = c;
    }
    HNode *h = d->heap;
    int64_t i = d->nheap++;
    while (i > 0) {
        int64_t p = (i - 1) >> 1;
        if (!hless(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return 1;
}

static HNode heap_pop(Drafter *d) {
    HNode *h = d->heap, top = h[0], x = h[--d->nheap];
    int64_t n = d->nheap, i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hless(&h[c + 1], &h[c])) c++;
        if (!hless(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = x;
    return top;
}

/* Pushes the splitter's children (parent, depth) with their ranges; the frontier takes the counts
 * of the first `left` of them and keeps its `left` best. */
static int push_children(Drafter *d, int32_t parent, int32_t depth, int64_t *seq, int64_t left) {
    const Split *sp = &d->w.sp;
    int64_t nk = sp->nkids, width = 2 * d->nsh;
    if (!grow(&d->pool, &d->pcap, d->npool + nk * width + 1)) return 0;
    for (int64_t j = 0; j < nk; j++) {
        HNode x = {sp->cand[j].low, sp->cand[j].token, (*seq)++, d->npool, parent, depth};
        memcpy(d->pool + d->npool, d->w.kr + j * width, sizeof(int64_t) * width);
        d->npool += width;
        if (!heap_push(d, x)) return 0;
    }
    if (left <= 0) {
        d->ntop = 0;
        return 1;
    }
    int64_t take = nk < left ? nk : left;  /* children come best first: merge two descending lists */
    if (!grow(&d->tmp, &d->tmpcap, left + 1) || !grow(&d->top, &d->tcap, left + 1)) return 0;
    int64_t a = 0, b = 0, n = 0;
    while (n < left && (a < d->ntop || b < take)) {
        if (b >= take || (a < d->ntop && d->top[a] >= sp->cand[b].low)) d->tmp[n++] = d->top[a++];
        else d->tmp[n++] = sp->cand[b++].low;
    }
    memcpy(d->top, d->tmp, sizeof(int64_t) * n);
    d->ntop = n;
    return 1;
}

static int emit(Drafter *d, int64_t token, int64_t parent, int64_t count) {
    if (d->nout == d->ocap) {
        int64_t c = d->ocap ? 2 * d->ocap : 256;
        int32_t *t = realloc(d->otok, sizeof(int32_t) * c);
        if (t) d->otok = t;
        int32_t *p = realloc(d->opar, sizeof(int32_t) * c);
        if (p) d->opar = p;
        int64_t *n = realloc(d->ocnt, sizeof(int64_t) * c);
        if (n) d->ocnt = n;
        if (!t || !p || !n) return 0;
        d->ocap = c;
    }
    d->otok[d->nout] = (int32_t)token, d->opar[d->nout] = (int32_t)parent, d->ocnt[d->nout] = count;
    d->nout++;
    return 1;
}

/* Suffix ranges of the last len tokens of tail in every shard into out; -> their total. */
static int64_t suffix_ranges(const Drafter *d, const int64_t *tail, int64_t m, int64_t len,
                             int64_t *out) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < d->nsh; i++) {
        out[2 * i] = 0, out[2 * i + 1] = 0;
        if (d->sh[i]->n > 0) {
            out[2 * i + 1] = -1;
            pattern_range_c(d->sh[i], tail + m - len, len, &out[2 * i], &out[2 * i + 1]);
        }
        total += out[2 * i + 1] - out[2 * i];
    }
    return total;
}

/* One draft after tail [m] (the context's last <= max_suffix ids), appended to d's output;
 * *match_len = the suffix length it grew from (0: none). -> 0 on memory error. */
static int draft_one(Drafter *d, const int64_t *tail, int64_t m, int64_t budget, int64_t max_depth,
                     int64_t max_suffix, int64_t min_suffix, int64_t min_count, double spec_factor,
                     int64_t *match_len) {
    *match_len = 0;
    int64_t start = m;  /* ids outside [0, separator) occur in no document: barriers */
    while (start > 0 && tail[start - 1] >= 0 && tail[start - 1] < d->seplim) start--;
    tail += start, m -= start;
    if (budget <= 0 || m < min_suffix || d->nsh == 0) return 1;
    int64_t a = min_suffix < 1 ? 1 : min_suffix, b = m, L = 0;
    while (a <= b) {  /* longest match: a suffix of length L occurs wherever one of L + 1 does */
        int64_t mid = a + ((b - a) >> 1), found = 0;
        for (Py_ssize_t i = 0; i < d->nsh && !found; i++)
            found = d->sh[i]->n > 0 && occurs_c(d->sh[i], tail + m - mid, mid);
        if (found) L = mid, a = mid + 1;
        else b = mid - 1;
    }
    if (!L) return 1;
    int64_t total = suffix_ranges(d, tail, m, L, d->rng);
    if (min_count > 1 && L < max_suffix && total < min_count) {  /* backoff: counts fall as L grows */
        int64_t lo_len = min_suffix, hi_len = L;
        while (lo_len < hi_len) {
            int64_t mid = (lo_len + hi_len) / 2;
            if (suffix_ranges(d, tail, m, mid, d->found) >= min_count) {
                L = mid, lo_len = mid + 1;
                memcpy(d->rng, d->found, sizeof(int64_t) * 2 * d->nsh);
            } else {
                hi_len = mid;
            }
        }
    }
    *match_len = L;
    if (spec_factor > 0) {  /* SuffixDecoding's max_spec_factor: no deeper than factor x match */
        int64_t cap = (int64_t)(spec_factor * (double)L);
        if (cap < 1) cap = 1;
        if (cap < max_depth) max_depth = cap;
    }
    d->nheap = d->npool = d->ntop = 0;
    int64_t seq = 0, popped = 0, n = 0;
    if (!split_node(&d->w, d->sh, d->rng, L, d->seplim, budget, 0, NULL, 0, d->samples, d->density)
        || !push_children(d, -1, 1, &seq, budget))
        return 0;
    while (d->nheap && n < budget) {
        HNode x = heap_pop(d);
        if (!emit(d, x.token, x.parent, x.count)) return 0;
        int32_t index = (int32_t)n++;
        popped++;
        if (d->ntop && d->top[0] == x.count) {  /* the frontier's best count was popped */
            memmove(d->top, d->top + 1, sizeof(int64_t) * (d->ntop - 1));
            d->ntop--;
        } else {  /* cannot happen with this pop order; stay exact regardless */
            d->ntop = 0;
        }
        int64_t left = budget - popped;
        if (x.depth >= max_depth || left <= 0) continue;
        /* a child below the left-th best count waiting in the heap can never be popped */
        int64_t floor = left <= d->ntop ? d->top[left - 1] : 0;
        if (!split_node(&d->w, d->sh, d->pool + x.roff, L + x.depth, d->seplim, left, floor, d->top,
                        d->ntop, d->samples, d->density)
            || !push_children(d, index, x.depth + 1, &seq, left))
            return 0;
    }
    return 1;
}

/* The last <= max_suffix ids of a context (a list/tuple of ints, or a 1-D integer buffer such as a
 * numpy array) into out; -> how many, -1 with an exception set. Ids beyond int64 become
 * INT64_MAX / INT64_MIN (they occur nowhere either way). */
static int64_t context_tail(PyObject *ctx, int64_t max_suffix, int64_t **buf, int64_t *cap,
                            int64_t at) {
    int64_t *out;
    if (!PyList_Check(ctx) && !PyTuple_Check(ctx) && PyObject_CheckBuffer(ctx)) {
        Py_buffer b;
        if (PyObject_GetBuffer(ctx, &b, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return -1;
        const char *f = b.format ? b.format : "B";
        while (*f == '<' || *f == '=' || *f == '@') f++;
        char code = f[0];
        int ok = b.ndim == 1 && code && !f[1] && strchr("bBhHiIlLqQ?", code) != NULL;
        if (!ok) {
            PyBuffer_Release(&b);
            PyErr_Format(PyExc_TypeError, "token ids must be a 1-D sequence of integers, got a "
                         "buffer of format %s and %d dimensions", b.format ? b.format : "B", b.ndim);
            return -1;
        }
        int64_t len = b.shape[0], take = len < max_suffix ? len : max_suffix;
        if (!grow(buf, cap, at + take + 1)) {
            PyBuffer_Release(&b);
            PyErr_NoMemory();
            return -1;
        }
        out = *buf + at;
        const char *base = (const char *)b.buf;
        for (int64_t j = 0; j < take; j++) {
            const char *p = base + (len - take + j) * b.strides[0];
            int64_t v;
            switch (code) {
            case 'b': v = *(const int8_t *)p; break;
            case 'B': case '?': v = *(const uint8_t *)p; break;
            case 'h': v = *(const int16_t *)p; break;
            case 'H': v = *(const uint16_t *)p; break;
            case 'i': v = *(const int32_t *)p; break;
            case 'I': v = *(const uint32_t *)p; break;
            case 'l': case 'q':
                v = b.itemsize == 4 ? *(const int32_t *)p : *(const int64_t *)p; break;
            default: {  /* L, Q */
                uint64_t u = b.itemsize == 4 ? *(const uint32_t *)p : *(const uint64_t *)p;
                v = u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
            }
            }
            out[j] = v;
        }
        PyBuffer_Release(&b);
        return take;
    }
    PyObject *fast = PySequence_Fast(ctx, "token ids must be a 1-D sequence of integers");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast), take = len < max_suffix ? len : max_suffix;
    if (!grow(buf, cap, at + take + 1)) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    out = *buf + at;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t j = 0; j < take; j++) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(items[len - take + j], &overflow);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[j] = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : (int64_t)v;
    }
    Py_DECREF(fast);
    return take;
}

/* An int or a sequence of n ints -> malloc'ed [n] (NULL + exception on error). */
static int64_t *per_context(PyObject *o, Py_ssize_t n, const char *name) {
    int64_t *out = malloc(sizeof(int64_t) * (n + 1));
    if (!out) return (int64_t *)PyErr_NoMemory();
    if (PyLong_Check(o)) {
        long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred()) {
            free(out);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) out[i] = v;
        return out;
    }
    free(out);
    Py_ssize_t m;
    out = int_array(o, &m);
    if (out && m != n) {
        free(out);
        PyErr_Format(PyExc_ValueError, "draft_batch: %s has %zd values for %zd contexts", name, m, n);
        return NULL;
    }
    return out;
}

static PyObject *int_tuple(const int64_t *v, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* A batch's contexts and settings, shared by its drafting threads; each thread takes the next
 * undrafted context (`next`, atomic) and appends its tree to its own Drafter. */
typedef struct {
    const int64_t *tails, *toff, *tlen, *budgets, *depths;
    int64_t n, max_suffix, min_suffix, min_count;
    double spec_factor;  /* > 0: depth <= spec_factor x match length */
    int64_t next;        /* the next context to draft */
    int64_t *who;        /* [n] the thread that drafted context i */
    int64_t *start;      /* [n] its first node in that thread's output; ends at start + size */
    int64_t *size;       /* [n] */
    int64_t *match;      /* [n] */
} Batch;

typedef struct {
    Batch *b;
    Drafter d;
    int64_t id;
    int ok;
} Worker;

static void *work(void *arg) {
    Worker *w = arg;
    Batch *b = w->b;
    for (;;) {
        int64_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (i >= b->n || !w->ok) break;
        int64_t before = w->d.nout;
        w->ok = draft_one(&w->d, b->tails + b->toff[i], b->tlen[i], b->budgets[i], b->depths[i],
                          b->max_suffix, b->min_suffix, b->min_count, b->spec_factor, &b->match[i]);
        b->who[i] = w->id, b->start[i] = before, b->size[i] = w->d.nout - before;
    }
    return NULL;
}

/* draft_batch(shards, contexts, budgets, max_depths, max_suffix, min_suffix, seplim, min_count,
 *             samples, density, threads=1, spec_factor=0) -> (tokens, parents, counts, offsets,
 *             match_lens); spec_factor > 0 caps each tree's depth at spec_factor x its match length
 * One exact trie per context (budgets, max_depths: an int, or one per context), all drafted with
 * the GIL released, by up to `threads` threads (each tree is drafted by one of them alone, so the
 * trees do not depend on it); out: bytearrays tokens [total] int32, parents [total] int32 (within
 * the tree) and counts [total] int64, tuples offsets [n + 1] (tree i = [offsets[i],
 * offsets[i + 1])) and match_lens [n]. */
static PyObject *py_draft_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *shards_o, *contexts_o, *budgets_o, *depths_o;
    long long max_suffix, min_suffix, seplim, min_count, samples, density, threads = 1;
    double spec_factor = 0.0;
    if (!PyArg_ParseTuple(args, "OOOOLLLLLL|Ld", &shards_o, &contexts_o, &budgets_o, &depths_o,
                          &max_suffix, &min_suffix, &seplim, &min_count, &samples, &density,
                          &threads, &spec_factor))
        return NULL;
    if (samples < 1 || density < 1 || min_suffix < 1 || max_suffix < min_suffix || min_count < 1
        || threads < 1 || !(spec_factor >= 0)) {
        PyErr_SetString(PyExc_ValueError, "draft_batch: need samples, density, min_count, threads "
                                          ">= 1, 1 <= min_suffix <= max_suffix and spec_factor >= 0");
        return NULL;
    }
    Py_ssize_t nsh;
    const Shard **sh = shard_array(shards_o, &nsh);
    if (!sh) return NULL;
    PyObject *cfast = PySequence_Fast(contexts_o, "draft_batch: contexts must be a sequence");
    Py_ssize_t n = cfast ? PySequence_Fast_GET_SIZE(cfast) : 0;
    if (threads > n) threads = n > 0 ? n : 1;
    if (threads > 64) threads = 64;
    int64_t *budgets = cfast ? per_context(budgets_o, n, "budgets") : NULL;
    int64_t *depths = budgets ? per_context(depths_o, n, "max_depths") : NULL;
    int64_t *tails = NULL, tcap = 0;  /* the contexts' tails, concatenated: tail i at toff[i] */
    int64_t *ints = depths ? malloc(sizeof(int64_t) * 7 * (n + 1)) : NULL;
    int64_t *tlen = ints, *toff = ints + (n + 1), *offsets = ints + 2 * (n + 1);
    Batch b = {.n = n, .max_suffix = max_suffix, .min_suffix = min_suffix, .min_count = min_count,
               .spec_factor = spec_factor, .budgets = budgets, .depths = depths, .tlen = tlen, .toff = toff};
    b.match = ints + 3 * (n + 1), b.who = ints + 4 * (n + 1), b.start = ints + 5 * (n + 1);
    b.size = ints + 6 * (n + 1);
    Worker *workers = ints ? calloc(threads, sizeof(Worker)) : NULL;
    PyObject *result = NULL;
    int64_t started = 0, total = 0;
    if (!workers) {
        if (depths && !PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (budgets[i] < 0 || depths[i] < 1) {
            PyErr_SetString(PyExc_ValueError, "draft_batch: need budget >= 0 and max_depth >= 1");
            goto done;
        }
        toff[i] = i ? toff[i - 1] + tlen[i - 1] : 0;
        tlen[i] = context_tail(PySequence_Fast_GET_ITEM(cfast, i), max_suffix, &tails, &tcap, toff[i]);
        if (tlen[i] < 0) goto done;
    }
    b.tails = tails;
    for (; started < threads; started++) {
        Worker *w = &workers[started];
        w->b = &b, w->id = started, w->ok = 1;
        if (!drafter_init(&w->d, sh, nsh, seplim, samples, density)) {
            started++;
            PyErr_NoMemory();
            goto done;
        }
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_t tid[64];
    int64_t spawned = 0;
    for (int64_t t = 1; t < threads; t++, spawned++)  /* this thread is worker 0 */
        if (pthread_create(&tid[t], NULL, work, &workers[t]) != 0) break;
    work(&workers[0]);
    for (int64_t t = 1; t <= spawned; t++) pthread_join(tid[t], NULL);
    for (int64_t t = 0; t < threads; t++) ok = ok && workers[t].ok;
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) offsets[i + 1] = offsets[i] + b.size[i];
    total = offsets[n];
    PyObject *tok = PyByteArray_FromStringAndSize(NULL, 4 * total);
    PyObject *par = PyByteArray_FromStringAndSize(NULL, 4 * total);
    PyObject *cnt = PyByteArray_FromStringAndSize(NULL, 8 * total);
    if (tok && par && cnt) {
        int32_t *ot = (int32_t *)PyByteArray_AS_STRING(tok), *op = (int32_t *)PyByteArray_AS_STRING(par);
        int64_t *oc = (int64_t *)PyByteArray_AS_STRING(cnt);
        for (Py_ssize_t i = 0; i < n; i++) {  /* the trees in context order */
            const Drafter *d = &workers[b.who[i]].d;
            int64_t s = b.start[i], m = b.size[i], o = offsets[i];
            if (!m) continue;
            memcpy(ot + o, d->otok + s, 4 * m), memcpy(op + o, d->opar + s, 4 * m);
            memcpy(oc + o, d->ocnt + s, 8 * m);
        }
        result = Py_BuildValue("(NNNNN)", tok, par, cnt, int_tuple(offsets, n + 1),
                               int_tuple(b.match, n));
    } else {
        Py_XDECREF(tok), Py_XDECREF(par), Py_XDECREF(cnt);
    }
done:
    for (int64_t t = 0; t < started; t++) drafter_free(&workers[t].d);
    free(workers);
    free(sh), free(budgets), free(depths), free(tails), free(ints);
    Py_XDECREF(cfast);
    return result;
}

static PyMethodDef methods[] = {
    {"pattern_range", py_pattern_range, METH_VARARGS,
     "pattern_range(shard, pattern, lo=0, hi=-1) -> (lo, hi) of the suffixes starting with pattern."},
    {"longest_match", py_longest_match, METH_VARARGS,
     "longest_match(shards, tail, min_suffix) -> (L, ranges) of the longest matching suffix."},
    {"split", py_split, METH_VARARGS,
     "split(shards, ranges, k, seplim, keep, floor, waiting, samples, density) -> (children, cut)."},
    {"draft_batch", py_draft_batch, METH_VARARGS,
     "draft_batch(shards, contexts, budgets, max_depths, max_suffix, min_suffix, seplim, min_count, "
     "samples, density, threads=1) -> (tokens, parents, counts, offsets, match_lens)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "datastore._kernel",
                                    "Compiled suffix-array search and child splitting.", -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    if (PyType_Ready(&ShardType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ShardType);
    if (PyModule_AddObject(m, "Shard", (PyObject *)&ShardType) < 0) {
        Py_DECREF(&ShardType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
