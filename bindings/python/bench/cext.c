/* What a compiled binding would cost: the three calls of the decode step
 * (resize, commit, num_committed_tokens) as a CPython extension with the
 * binding's rules (integers range-checked, tokens from a list or an int32
 * buffer, the GIL released around the C call, a status raised). Not part of
 * the package: bookkeeping.py compiles it at run time to measure the way
 * issue 11 leaves open (kvcmgen generating such an extension). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "kvcm/kvcm.h"

static PyObject* raise_status(kvcm_status* st)
{
    PyErr_Format(PyExc_RuntimeError, "kvcm: %s", kvcm_status_get_message(st));
    kvcm_status_free(st);
    return NULL;
}

static int as_u64(PyObject* o, const char* name, uint64_t* out)
{
    if (!PyLong_Check(o) || PyBool_Check(o))
    {
        PyErr_Format(PyExc_TypeError, "%s: expected an int", name);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(o);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static int as_i64(PyObject* o, const char* name, int64_t* out)
{
    if (!PyLong_Check(o) || PyBool_Check(o))
    {
        PyErr_Format(PyExc_TypeError, "%s: expected an int", name);
        return -1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
    {
        PyErr_Format(PyExc_OverflowError, "%s: out of range for int64_t", name);
        return -1;
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject* resize(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t cache;
    int64_t capacity, history;
    if (nargs != 3 || as_u64(args[0], "cache", &cache) || as_i64(args[1], "capacity", &capacity)
        || as_i64(args[2], "history_length", &history))
    {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "resize(cache, capacity, history_length)");
        return NULL;
    }
    kvcm_status* st;
    Py_BEGIN_ALLOW_THREADS
    st = kvcm_kv_cache_resize(cache, capacity, history);
    Py_END_ALLOW_THREADS
    if (st) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject* committed(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t cache;
    if (nargs != 1 || as_u64(args[0], "cache", &cache)) return NULL;
    int64_t out = 0;
    kvcm_status* st;
    Py_BEGIN_ALLOW_THREADS
    st = kvcm_kv_cache_get_num_committed_tokens(cache, &out);
    Py_END_ALLOW_THREADS
    if (st) return raise_status(st);
    return PyLong_FromLongLong(out);
}

static PyObject* commit(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
    (void)self;
    uint64_t cache;
    if (nargs != 3 || as_u64(args[0], "cache", &cache)) return NULL;
    PyObject* tokens = args[1];
    int is_end = PyObject_IsTrue(args[2]);
    if (is_end < 0) return NULL;
    kvcm_token small[64];
    kvcm_token* toks = small;
    Py_ssize_t n = 0;
    Py_buffer view = {0};
    int have_view = 0;
    if (PyList_CheckExact(tokens))
    {
        n = PyList_GET_SIZE(tokens);
        if (n > 64 && !(toks = PyMem_Malloc(sizeof(kvcm_token) * (size_t)n))) return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < n; i++)
        {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(tokens, i), &overflow);
            if (overflow || v < INT32_MIN || v > INT32_MAX || (v == -1 && PyErr_Occurred()))
            {
                if (!PyErr_Occurred()) PyErr_Format(PyExc_OverflowError, "tokens[%zd]: out of range for int32_t", i);
                if (toks != small) PyMem_Free(toks);
                return NULL;
            }
            toks[i] = (kvcm_token)v;
        }
    }
    else
    {
        if (PyObject_GetBuffer(tokens, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
        have_view = 1;
        if (view.itemsize != 4 || !view.format || (strcmp(view.format, "i") && strcmp(view.format, "<i")))
        {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "tokens: expected an int32 buffer");
            return NULL;
        }
        toks = view.buf;
        n = view.len / 4;
    }
    kvcm_status* st;
    Py_BEGIN_ALLOW_THREADS
    st = kvcm_kv_cache_commit(cache, n ? toks : NULL, (size_t)n, is_end);
    Py_END_ALLOW_THREADS
    if (have_view)
        PyBuffer_Release(&view);
    else if (toks != small)
        PyMem_Free(toks);
    if (st) return raise_status(st);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"resize", (PyCFunction)(void (*)(void))resize, METH_FASTCALL, "kvcm_kv_cache_resize"},
    {"commit", (PyCFunction)(void (*)(void))commit, METH_FASTCALL, "kvcm_kv_cache_commit"},
    {"committed", (PyCFunction)(void (*)(void))committed, METH_FASTCALL, "kvcm_kv_cache_get_num_committed_tokens"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvcm_bench_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kvcm_bench_ext(void)
{
    return PyModule_Create(&module);
}
