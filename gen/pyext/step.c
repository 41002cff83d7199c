
/* ---- The decode step of a KV cache (gen/pyext/step.c, copied verbatim
 * when the ABI has kvcm_kv_cache_resize, kvcm_kv_cache_commit and
 * kvcm_kv_cache_decode_steps) ----
 *
 * kvcm._kvcm_ext.CacheStep(handle, tokens_per_block, owner, resize, commit)
 * holds what kvcm.manager._KVCache's decode step decides by (its deferral
 * mirror: committed, history, capacity, limit; the tokens of the deferred
 * commits and decode steps; windows;
 * fast, which _KVCache keeps true while a resize needs no Python-level work
 * around the library call) and its resize and commit methods, which the
 * cache installs as its own attributes, so that the decode step is one C
 * call with no Python frame:
 *
 * - resize(capacity, history_length=None) with exact ints (history None or
 *   not negative) while fast, or while key is in the set mark (a cache
 *   whose statistics id is marked dirty already): the library's resize, the history mirror
 *   updated; True, or False when the library reports OUT_OF_PAGES (the
 *   resize then changed nothing), other failures raised as the binding
 *   raises them;
 * - resize(c + 1, c + 1) of a decode step while fast (or marked) with c
 *   the committed tokens, the history and the capacity, no deferred resize
 *   waiting for its commit, windows not None (a tuple of the layer groups'
 *   sliding window sizes: one beam, no SWA scratch reuse), the limit set,
 *   c inside a block (the resize needs no page) and no window's first kept
 *   block moving: deferred, the history and capacity mirrors advanced;
 *   True. A resize that does not defer first flushes the deferred steps;
 * - commit(tokens) after such a resize, with one exact int32 int: the
 *   decode step deferred (its token kept), flushed at once when it fills
 *   the block (a published block is never deferred);
 * - commit(tokens) with an exact list or tuple of exact int32 ints that
 *   stays within the limit and the history, no decode step deferred:
 *   deferred (the tokens kept, the committed mirror advanced);
 * - commit(tokens) with an exact list or tuple of exact int32 ints (an
 *   empty one included) that does not defer, while the limit is set (the cache ACTIVE
 *   and open, commits allowed and deferrable, no fresh run owed, the
 *   committed count known) and fast or with mark set (no callback, no page
 *   index views or buffers; whether the id is marked yet does not matter, as
 *   no commit notes statistics): what is deferred is flushed, then the library's
 *   commit, the committed, history and limit mirrors advanced as the
 *   Python method advances them; failures raised as the binding raises
 *   them;
 * - everything else calls the Python method given, resize(owner, ...) or
 *   commit(owner, ...), with the same arguments: the argument rules, errors
 *   and every other case stay the Python method's.
 *
 * defer(tokens) is commit's deferral alone (True when deferred, else
 * False, changing nothing); defer_resize(capacity, history) and
 * defer_step(tokens) are resize's and commit's decode step deferral alone
 * (the same answers); flush() hands the library what is deferred, in
 * order: the deferred commits in one commit, the decode steps in one
 * kvcm_kv_cache_decode_steps, the resize waiting for its commit (what a
 * failed call would have passed stays deferred; the error is raised).
 * tokens() returns the deferred tokens (commits and steps) as a list;
 * pending is their number plus one for a resize waiting for its commit;
 * steps is the deferred decode steps (and that resize). While a flush is
 * in the library (the GIL released) nothing defers and a second flush
 * raises RuntimeError, so the tokens it passes stay as they are. owner is held by a weak reference (the cache holds
 * this object).
 * Library calls make the checks of every extension call (kx_enter,
 * kx_leave) and release the GIL. */

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    kvcm_kv_cache handle;
    long long tpb;
    long long committed, history, capacity, limit;
    int fast;
    kvcm_token *tokens;
    Py_ssize_t ntokens, cap;
    Py_ssize_t nsteps; /* the last nsteps tokens are decode steps' */
    int rpend;         /* a deferred decode step's resize waits for its commit */
    PyObject *windows; /* a tuple of window sizes (decode steps defer), or NULL / None */
    int flushing; /* flush() is in the library with tokens: nothing defers */
    PyObject *owner; /* a weak reference */
    PyObject *slow_resize, *slow_commit;
    PyObject *mark, *key; /* a set and a key in it, or NULL / None */
} kx_step;

static PyTypeObject kx_step_type;

static PyObject *kx_step_make(PyTypeObject *type, unsigned long long handle, long long tpb, PyObject *owner,
                              PyObject *resize, PyObject *commit);

static PyObject *kx_step_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"handle", "tokens_per_block", "owner", "resize", "commit", NULL};
    unsigned long long handle;
    long long tpb;
    PyObject *owner, *resize, *commit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLOOO", kw, &handle, &tpb, &owner, &resize, &commit))
        return NULL;
    return kx_step_make(type, handle, tpb, owner, resize, commit);
}

/* CacheStep(...) without an argument tuple (one per KV cache created):
 * five positional arguments, the first an exact int and the second one
 * that fits a long long, are taken as kx_step_new's format takes them;
 * any other call goes to kx_step_new (and its errors). */
static PyObject *kx_step_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!kwnames && nargs == 5 && PyLong_CheckExact(args[0]) && PyLong_CheckExact(args[1])) {
        int overflow;
        long long tpb = PyLong_AsLongLongAndOverflow(args[1], &overflow);
        if (!overflow) {
            unsigned long long handle = PyLong_AsUnsignedLongLongMask(args[0]);
            if (handle == (unsigned long long)-1 && PyErr_Occurred())
                return NULL;
            return kx_step_make((PyTypeObject *)type, handle, tpb, args[2], args[3], args[4]);
        }
    }
    PyObject *tuple = PyTuple_New(nargs);
    PyObject *kwargs = kwnames ? PyDict_New() : NULL;
    PyObject *r = NULL;
    if (!tuple || (kwnames && !kwargs))
        goto done;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    for (Py_ssize_t i = 0; kwnames && i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto done;
    }
    r = kx_step_new((PyTypeObject *)type, tuple, kwargs);
done:
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    return r;
}

static PyObject *kx_step_make(PyTypeObject *type, unsigned long long handle, long long tpb, PyObject *owner,
                              PyObject *resize, PyObject *commit)
{
    if (tpb <= 0) {
        PyErr_SetString(PyExc_ValueError, "tokens_per_block: must be positive");
        return NULL;
    }
    kx_step *s = (kx_step *)type->tp_alloc(type, 0);
    if (!s)
        return NULL;
    s->owner = PyWeakref_NewRef(owner, NULL);
    if (!s->owner) {
        Py_DECREF(s);
        return NULL;
    }
    s->handle = (kvcm_kv_cache)handle;
    s->tpb = tpb;
    s->committed = s->history = s->capacity = s->limit = -1;
    s->slow_resize = Py_NewRef(resize);
    s->slow_commit = Py_NewRef(commit);
    return (PyObject *)s;
}

static int kx_step_traverse(kx_step *s, visitproc visit, void *arg)
{
    Py_VISIT(s->owner);
    Py_VISIT(s->slow_resize);
    Py_VISIT(s->slow_commit);
    Py_VISIT(s->mark);
    Py_VISIT(s->key);
    Py_VISIT(s->windows);
    return 0;
}

static int kx_step_clear(kx_step *s)
{
    Py_CLEAR(s->owner);
    Py_CLEAR(s->slow_resize);
    Py_CLEAR(s->slow_commit);
    Py_CLEAR(s->mark);
    Py_CLEAR(s->key);
    Py_CLEAR(s->windows);
    return 0;
}

static void kx_step_dealloc(kx_step *s)
{
    PyObject_GC_UnTrack(s);
    kx_step_clear(s);
    PyMem_Free(s->tokens);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* fn(owner, *args, **kwargs): the Python method's path. */
static PyObject *kx_step_slow(kx_step *s, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!s->owner || !fn) {
        PyErr_SetString(PyExc_ReferenceError, "the KV cache of this method is gone");
        return NULL;
    }
    PyObject *owner = PyWeakref_GetObject(s->owner);
    if (!owner)
        return NULL;
    if (owner == Py_None) {
        PyErr_SetString(PyExc_ReferenceError, "the KV cache of this method is gone");
        return NULL;
    }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[8];
    PyObject **all = small;
    if (nargs + nkw + 1 > 8) {
        all = PyMem_Malloc((size_t)(nargs + nkw + 1) * sizeof(PyObject *));
        if (!all)
            return PyErr_NoMemory();
    }
    all[0] = owner;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        all[i + 1] = args[i];
    Py_INCREF(owner);
    PyObject *r = PyObject_Vectorcall(fn, all, (size_t)(nargs + 1), kwnames);
    Py_DECREF(owner);
    if (all != small)
        PyMem_Free(all);
    return r;
}

/* An exact int in [0, INT64_MAX], or -1. */
static inline long long kx_step_nonneg(PyObject *o)
{
    if (!PyLong_CheckExact(o))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return overflow ? -1 : v;
}

static int kx_step_flush_all(kx_step *s);

/* The first block a window of w tokens keeps once h tokens are computed
 * (layout.FirstKeptBlock). */
static inline long long kx_step_first_kept(long long w, long long h, long long tpb)
{
    return w <= 0 || h + 1 <= w ? 0 : (h + 1 - w) / tpb;
}

/* Whether resize(capacity, history) is a decode step that can wait: see
 * the type's comment. */
static int kx_step_can_step(kx_step *s, long long capacity, long long history)
{
    long long c = s->committed;
    if (!s->windows || !PyTuple_Check(s->windows) || s->limit < 0 || s->flushing || s->rpend || c <= 0 ||
        s->history != c || s->capacity != c || capacity != c + 1 || history != c + 1 || c % s->tpb == 0)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->windows); i++) {
        long long w = kx_step_nonneg(PyTuple_GET_ITEM(s->windows, i));
        if (w < 0 || kx_step_first_kept(w, c + 1, s->tpb) != kx_step_first_kept(w, c, s->tpb))
            return 0;
    }
    return 1;
}

static PyObject *kx_step_resize(kx_step *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames || nargs < 1 || nargs > 2)
        return kx_step_slow(s, s->slow_resize, args, nargs, kwnames);
    if (!s->fast) {
        int marked = s->mark && PySet_Check(s->mark) && s->key ? PySet_Contains(s->mark, s->key) : 0;
        if (marked < 0)
            return NULL;
        if (!marked)
            return kx_step_slow(s, s->slow_resize, args, nargs, kwnames);
    }
    long long capacity = kx_step_nonneg(args[0]);
    long long history = -1;
    if (capacity < 0)
        return kx_step_slow(s, s->slow_resize, args, nargs, kwnames);
    if (nargs == 2 && args[1] != Py_None) {
        history = kx_step_nonneg(args[1]);
        if (history < 0)
            return kx_step_slow(s, s->slow_resize, args, nargs, kwnames);
    }
    if (kx_step_can_step(s, capacity, history)) {
        s->history = s->capacity = history;
        s->rpend = 1;
        Py_RETURN_TRUE;
    }
    if ((s->nsteps || s->rpend) && kx_step_flush_all(s) < 0)
        return NULL;
    if (kx_enter(0, 0, "resize") < 0)
        return NULL;
    kvcm_status *st;
    Py_BEGIN_ALLOW_THREADS
    st = kx_api->KX_STEP_RESIZE(s->handle, (int64_t)capacity, (int64_t)history);
    Py_END_ALLOW_THREADS
    if (st && kx_api->status_get_code(st) == KVCM_ERR_OUT_OF_PAGES) {
        kx_api->status_free(st);
        return kx_leave(NULL, Py_NewRef(Py_False));
    }
    if (!st) {
        if (history >= 0)
            s->history = history;
        s->capacity = capacity;
    }
    return kx_leave(st, Py_NewRef(Py_True));
}

static int kx_step_keep(kx_step *s, PyObject *t, Py_ssize_t n);

/* Defers t when it is an exact list or tuple of exact int32 ints that
 * stays within the limit and the history: 1 when deferred, 0 when not, -1
 * on error. */
static int kx_step_try_defer(kx_step *s, PyObject *t)
{
    if (!PyList_CheckExact(t) && !PyTuple_CheckExact(t))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(t);
    long long c = s->committed + n;
    if (!n || c > s->limit || c > s->history || s->flushing || s->nsteps || s->rpend)
        return 0;
    return kx_step_keep(s, t, n);
}

/* Keeps the n tokens of t (checked as int32 ints): 1 when kept, 0 when one
 * is not an int32 int, -1 on error. */
static int kx_step_keep(kx_step *s, PyObject *t, Py_ssize_t n)
{
    long long c = s->committed + n;
    if (s->ntokens + n > s->cap) {
        Py_ssize_t cap = s->cap ? s->cap : 32;
        while (cap < s->ntokens + n)
            cap *= 2;
        kvcm_token *p = PyMem_Realloc(s->tokens, (size_t)cap * sizeof(kvcm_token));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        s->tokens = p;
        s->cap = cap;
    }
    PyObject **items = PySequence_Fast_ITEMS(t);
    kvcm_token *d = s->tokens + s->ntokens;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!kx_token_of(items[k], &d[k]))
            return 0;
    }
    s->ntokens += n;
    s->committed = c;
    return 1;
}

/* Defers t, one exact int32 int in an exact list or tuple, as the commit
 * of the decode step whose resize waits: 1 when deferred (flushed at once
 * when it fills the block: -1 when that fails), 0 when not, -1 on error. */
static int kx_step_try_step(kx_step *s, PyObject *t)
{
    if (!s->rpend || s->flushing || (!PyList_CheckExact(t) && !PyTuple_CheckExact(t)) ||
        PySequence_Fast_GET_SIZE(t) != 1 || s->committed + 1 != s->history)
        return 0;
    int r = kx_step_keep(s, t, 1);
    if (r <= 0)
        return r;
    s->nsteps++;
    s->rpend = 0;
    if (s->committed % s->tpb == 0) {
        if (kx_step_flush_all(s) < 0)
            return -1;
        s->limit = s->committed + s->tpb - 1; /* the next block's */
    }
    return 1;
}

/* Commits t now when it is an exact list or tuple of exact int32 ints and
 * the cache needs nothing around the library call (see the type's
 * comment): 1 when committed, 0 when the Python method is to decide, -1
 * with the error raised. */
static int kx_step_try_commit(kx_step *s, PyObject *t)
{
    if (s->limit < 0 || s->flushing || (!s->fast && !(s->mark && s->mark != Py_None)) ||
        (!PyList_CheckExact(t) && !PyTuple_CheckExact(t)))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(t);
    kvcm_token small[64];
    kvcm_token *toks = n <= 64 ? small : PyMem_Malloc((size_t)n * sizeof(kvcm_token));
    if (!toks) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(t);
    int r = 1;
    for (Py_ssize_t k = 0; k < n && r; k++)
        r = kx_token_of(items[k], &toks[k]);
    if (r && (s->ntokens || s->rpend) && kx_step_flush_all(s) < 0)
        r = -1;
    if (r > 0 && kx_enter(0, 0, "commit") < 0)
        r = -1;
    if (r > 0) {
        kvcm_status *st;
        Py_BEGIN_ALLOW_THREADS
        st = kx_api->KX_STEP_COMMIT(s->handle, n ? toks : NULL, (size_t)n, false);
        Py_END_ALLOW_THREADS
        PyObject *res = kx_leave(st, Py_NewRef(Py_None));
        if (res) {
            Py_DECREF(res);
            long long c = s->committed + n;
            s->committed = c;
            if (s->history >= 0 && s->history < c)
                s->history = c;
            /* Unless the cache stopped deferring during the call (closed,
             * suspended on another thread): the limit of the new block. */
            if (s->limit >= 0)
                s->limit = c - c % s->tpb + s->tpb - 1;
        } else
            r = -1;
    }
    if (toks != small)
        PyMem_Free(toks);
    return r;
}

static PyObject *kx_step_commit(kx_step *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs == 1 && !kwnames && s->rpend) {
        int r = kx_step_try_step(s, args[0]);
        if (r < 0)
            return NULL;
        if (r)
            Py_RETURN_NONE;
    }
    if (nargs == 1 && !kwnames) {
        int r = kx_step_try_defer(s, args[0]);
        if (r == 0)
            r = kx_step_try_commit(s, args[0]);
        if (r < 0)
            return NULL;
        if (r)
            Py_RETURN_NONE;
    }
    return kx_step_slow(s, s->slow_commit, args, nargs, kwnames);
}

static PyObject *kx_step_defer(kx_step *s, PyObject *t)
{
    int r = kx_step_try_defer(s, t);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *kx_step_defer_resize(kx_step *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "defer_resize(capacity, history_length)");
        return NULL;
    }
    long long capacity = kx_step_nonneg(args[0]), history = kx_step_nonneg(args[1]);
    if (capacity < 0 || history < 0 || !kx_step_can_step(s, capacity, history))
        Py_RETURN_FALSE;
    s->history = s->capacity = history;
    s->rpend = 1;
    Py_RETURN_TRUE;
}

static PyObject *kx_step_defer_step(kx_step *s, PyObject *t)
{
    int r = kx_step_try_step(s, t);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* One library call of the flush with the GIL released; 0, or -1 with the
 * error raised. */
static int kx_step_call(kx_step *s, int what, Py_ssize_t n)
{
    if (kx_enter(0, 0, "flush") < 0)
        return -1;
    kvcm_status *st;
    s->flushing = 1;
    Py_BEGIN_ALLOW_THREADS
    if (what == 0)
        st = kx_api->KX_STEP_COMMIT(s->handle, s->tokens, (size_t)n, false);
    else if (what == 1)
        st = kx_api->KX_STEP_DECODE(s->handle, s->tokens, (size_t)n);
    else
        st = kx_api->KX_STEP_RESIZE(s->handle, (int64_t)s->capacity, (int64_t)s->history);
    Py_END_ALLOW_THREADS
    s->flushing = 0;
    PyObject *r = kx_leave(st, Py_NewRef(Py_None));
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Hands the library what is deferred, in order (see the type's comment):
 * 0, or -1 with the error raised and what it did not pass still deferred. */
static int kx_step_flush_all(kx_step *s)
{
    if (!s->ntokens && !s->rpend)
        return 0;
    if (s->flushing) {
        PyErr_SetString(PyExc_RuntimeError,
                        "kvcm: this KV cache's deferred commits are being committed by another thread");
        return -1;
    }
    Py_ssize_t plain = s->ntokens - s->nsteps;
    if (plain) {
        if (kx_step_call(s, 0, plain) < 0)
            return -1;
        memmove(s->tokens, s->tokens + plain, (size_t)s->nsteps * sizeof(kvcm_token));
        s->ntokens = s->nsteps;
    }
    if (s->nsteps) {
        if (kx_step_call(s, 1, s->nsteps) < 0)
            return -1;
        s->ntokens = s->nsteps = 0;
    }
    if (s->rpend) {
        if (kx_step_call(s, 2, 0) < 0)
            return -1;
        s->rpend = 0;
    }
    return 0;
}

static PyObject *kx_step_flush(kx_step *s, PyObject *unused)
{
    (void)unused;
    if (kx_step_flush_all(s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *kx_step_tokens(kx_step *s, PyObject *unused)
{
    (void)unused;
    PyObject *l = PyList_New(s->ntokens);
    for (Py_ssize_t i = 0; l && i < s->ntokens; i++) {
        PyObject *v = PyLong_FromLong(s->tokens[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *kx_step_pending(kx_step *s, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(s->ntokens + s->rpend);
}

static PyObject *kx_step_steps(kx_step *s, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(s->nsteps + s->rpend);
}

static PyMethodDef kx_step_methods[] = {
    {"resize", (PyCFunction)(void (*)(void))kx_step_resize, METH_FASTCALL | METH_KEYWORDS,
     "resize(capacity, history_length=None) -> bool: the KV cache's resize (see its class)"},
    {"commit", (PyCFunction)(void (*)(void))kx_step_commit, METH_FASTCALL | METH_KEYWORDS,
     "commit(accepted_input_tokens, beam_search_indices=None, is_end=False): the KV cache's commit "
     "(see its class)"},
    {"defer", (PyCFunction)kx_step_defer, METH_O,
     "defer(tokens) -> bool: defer the commit of tokens (a list or tuple of int32 ints within the limit "
     "and the history)"},
    {"defer_resize", (PyCFunction)(void (*)(void))kx_step_defer_resize, METH_FASTCALL,
     "defer_resize(capacity, history_length) -> bool: defer a decode step's resize"},
    {"defer_step", (PyCFunction)kx_step_defer_step, METH_O,
     "defer_step(tokens) -> bool: defer the commit of the decode step whose resize waits"},
    {"flush", (PyCFunction)kx_step_flush, METH_NOARGS,
     "flush(): hand the library the deferred commits and decode steps"},
    {"tokens", (PyCFunction)kx_step_tokens, METH_NOARGS, "tokens() -> the deferred tokens, a list"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef kx_step_members[] = {
    {"committed", T_LONGLONG, offsetof(kx_step, committed), 0, "committed tokens, deferred ones included (-1: unknown)"},
    {"history", T_LONGLONG, offsetof(kx_step, history), 0, "the history length (-1: unknown)"},
    {"capacity", T_LONGLONG, offsetof(kx_step, capacity), 0, "the capacity (-1: unknown)"},
    {"limit", T_LONGLONG, offsetof(kx_step, limit), 0, "the committed count deferred commits may reach (-1: none)"},
    {"fast", T_BOOL, offsetof(kx_step, fast), 0, "resize needs no Python-level work around the call"},
    {"mark", T_OBJECT, offsetof(kx_step, mark), 0, "a set: resize needs no Python-level work while key is in it"},
    {"key", T_OBJECT, offsetof(kx_step, key), 0, "the key of mark"},
    {"windows", T_OBJECT, offsetof(kx_step, windows), 0,
     "a tuple of the sliding window sizes: decode steps defer (None: they do not)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef kx_step_getset[] = {
    {"pending", (getter)kx_step_pending, NULL, "the deferred tokens, plus one for a resize waiting for its commit", NULL},
    {"steps", (getter)kx_step_steps, NULL, "the deferred decode steps, a resize waiting for its commit included", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject kx_step_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcm._kvcm_ext.CacheStep",
    .tp_basicsize = sizeof(kx_step),
    .tp_dealloc = (destructor)kx_step_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)kx_step_traverse,
    .tp_clear = (inquiry)kx_step_clear,
    .tp_doc = "The decode step of a KV cache (kvcm.manager._KVCache)",
    .tp_methods = kx_step_methods,
    .tp_members = kx_step_members,
    .tp_getset = kx_step_getset,
    .tp_new = kx_step_new,
    .tp_vectorcall = kx_step_vectorcall,
};

static int kx_add_types(PyObject *module)
{
    if (PyType_Ready(&kx_step_type) < 0)
        return -1;
    Py_INCREF(&kx_step_type);
    if (PyModule_AddObject(module, "CacheStep", (PyObject *)&kx_step_type) < 0) {
        Py_DECREF(&kx_step_type);
        return -1;
    }
    return 0;
}
