/* ---- Runtime of the extension (gen/pyext/runtime.c, copied verbatim) ----
 *
 * The argument rules are kvcm._convert's and kvcm._native.bind's:
 *
 * - Integers: an exact int that fits the C type is taken at C speed; any
 *   other value goes through kvcm._convert.integer, the ctypes path's own
 *   check, so the TypeError / InvalidArgumentError and its message are the
 *   same (bool, float, str refused; __index__ types taken; the range named).
 * - bool parameters take any object's truth value (as ctypes' c_bool does);
 *   double parameters any float or int.
 * - Pointers: None (NULL), an int address, bytes (const pointers only),
 *   ctypes.byref(obj[, offset]), a ctypes instance (its address; for a
 *   ctypes pointer, c_void_p, c_char_p or function pointer, the pointer it
 *   holds) or any object with the buffer protocol (held until the call
 *   returns). For a pointer to one element (no count parameter), a ctypes
 *   object smaller than the element is refused.
 * - Every call: a fork() child is refused (kvcm._managed.check_not_forked),
 *   objects whose finalizers ran inside a callback are released before and
 *   after the call (kvcm._managed.release_deferred), the GIL is released
 *   around the C call (every call may take the manager's lock, which a
 *   callback running Python code on another thread may hold, and callbacks
 *   take the GIL themselves, as ctypes does), and a returned status is
 *   freed and raised as the class kvcm.errors maps its code to.
 *
 * The library is the one kvcm._native loaded through ctypes (KVCM_LIBRARY,
 * the bundled one, or the checkout's build/): on the first call the load
 * hook loads it and hands over kvcm_get_api's address, and every call goes
 * through that function table. The extension is never linked to libkvcm.
 *
 * ctypes has no C API, so two of its object layouts are read directly: the
 * buffer pointer and size of a ctypes instance and the pointer of a byref()
 * argument. Module initialisation checks both against ctypes.addressof and
 * fails (kvcm then uses its ctypes path) when a Python version lays them out
 * differently.
 */

#include <stdint.h>
#include <string.h>

/* The head of every ctypes instance (CPython's CDataObject). */
typedef struct {
    PyObject_HEAD
    char *b_ptr;
    int b_needsfree;
    PyObject *b_base;
    Py_ssize_t b_size;
} kx_cdata;

/* A ctypes.byref() argument (CPython's PyCArgObject). */
typedef struct {
    PyObject_HEAD
    void *pffi_type;
    char tag;
    union {
        char c;
        long double D;
        void *p;
    } value;
    PyObject *obj;
} kx_carg;

static const kvcm_api *kx_api;
static int kx_forked;
static PyObject *kx_load_hook;      /* () -> None: loads the library, calls attach() */
static PyObject *kx_integer;        /* kvcm._convert.integer */
static PyObject *kx_tokens_slow;    /* kvcm._convert's Python token conversion */
static PyObject *kx_check_fork;     /* kvcm._managed.check_not_forked */
static PyObject *kx_release;        /* kvcm._managed.release_deferred */
static PyObject *kx_deferred;       /* kvcm._managed._deferred (a deque) */
static PyObject *kx_errors;         /* kvcm.errors._BY_CODE: code -> class */
static PyObject *kx_base_error;     /* kvcm.errors.KVCacheError */
static PyTypeObject *kx_carg_type, *kx_cdata_type, *kx_pointer_type, *kx_funcptr_type;
static PyTypeObject *kx_void_p_type, *kx_char_p_type;

static int kx_not_configured(void)
{
    PyErr_SetString(PyExc_RuntimeError, "kvcm._kvcm_ext: configure() was not called");
    return -1;
}

/* The checks before a call: arity, fork() child, deferred finalizers, the
 * library loaded. */
static int kx_enter(Py_ssize_t nargs, Py_ssize_t want, const char *fn)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd positional arguments but %zd were given", fn, want, nargs);
        return -1;
    }
    if (!kx_release)
        return kx_not_configured();
    if (kx_forked) {
        PyObject *r = PyObject_CallNoArgs(kx_check_fork);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    if (Py_SIZE(kx_deferred)) {
        PyObject *r = PyObject_CallNoArgs(kx_release);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    if (!kx_api) {
        PyObject *r = PyObject_CallNoArgs(kx_load_hook);
        if (!r)
            return -1;
        Py_DECREF(r);
        if (!kx_api) {
            PyErr_SetString(PyExc_RuntimeError, "kvcm._kvcm_ext: the load hook attached no library");
            return -1;
        }
    }
    return 0;
}

/* After the call: deferred finalizers, then the status. Frees st. */
static PyObject *kx_leave(kvcm_status *st, PyObject *result)
{
    if (Py_SIZE(kx_deferred)) {
        PyObject *r = PyObject_CallNoArgs(kx_release);
        Py_XDECREF(r);
        if (!r) {
            if (st)
                kx_api->status_free(st);
            Py_XDECREF(result);
            return NULL;
        }
    }
    if (!st)
        return result;
    Py_XDECREF(result);
    int code = (int)kx_api->status_get_code(st);
    const char *msg = kx_api->status_get_message(st);
    PyObject *text = PyUnicode_DecodeUTF8(msg ? msg : "", msg ? (Py_ssize_t)strlen(msg) : 0, "replace");
    kx_api->status_free(st);
    if (!text)
        return NULL;
    PyObject *key = PyLong_FromLong(code);
    PyObject *cls = key ? PyDict_GetItemWithError(kx_errors, key) : NULL;
    Py_XDECREF(key);
    if (!cls) {
        if (PyErr_Occurred()) {
            Py_DECREF(text);
            return NULL;
        }
        cls = kx_base_error;
    }
    PyObject *exc = PyObject_CallFunction(cls, "Oi", text, code);
    Py_DECREF(text);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* The ctypes path's check of a value that is not an exact int in range:
 * kvcm._convert.integer(value, lo, hi, ctname, name) raises or returns an
 * exact int in range. */
static PyObject *kx_integer_slow(PyObject *o, PyObject *lo, PyObject *hi, const char *ctname, PyObject *names,
                                 Py_ssize_t i)
{
    PyObject *r = NULL;
    if (lo && hi)
        r = PyObject_CallFunction(kx_integer, "OOOsO", o, lo, hi, ctname, PyTuple_GET_ITEM(names, i));
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    return r;
}

static inline int kx_signed(PyObject *o, PyObject *names, Py_ssize_t i, long long lo, long long hi, const char *ctname,
                     long long *out)
{
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && v >= lo && v <= hi) {
            *out = v;
            return 0;
        }
    }
    PyObject *r = kx_integer_slow(o, PyLong_FromLongLong(lo), PyLong_FromLongLong(hi), ctname, names, i);
    if (!r)
        return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static inline int kx_unsigned(PyObject *o, PyObject *names, Py_ssize_t i, unsigned long long hi, const char *ctname,
                       unsigned long long *out)
{
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && v >= 0 && (unsigned long long)v <= hi) {
            *out = (unsigned long long)v;
            return 0;
        }
        if (overflow > 0 && hi == UINT64_MAX) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
                *out = u;
                return 0;
            }
            PyErr_Clear();
        }
    }
    PyObject *r = kx_integer_slow(o, PyLong_FromLong(0), PyLong_FromUnsignedLongLong(hi), ctname, names, i);
    if (!r)
        return -1;
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return (*out == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
}

static inline int kx_bool(PyObject *o, bool *out)
{
    int v = PyObject_IsTrue(o);
    if (v < 0)
        return -1;
    *out = v != 0;
    return 0;
}

static inline int kx_double(PyObject *o, PyObject *names, Py_ssize_t i, double *out)
{
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%U: expected a float, got %s", PyTuple_GET_ITEM(names, i),
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = v;
    return 0;
}

/* A converted pointer argument; view holds a buffer export for the call. */
typedef struct {
    void *p;
    Py_buffer view;
    int has_view;
} kx_ptr;

#define KX_PTR_INIT {NULL, {0}, 0}

static void kx_ptr_release(kx_ptr *p)
{
    if (p->has_view) {
        PyBuffer_Release(&p->view);
        p->has_view = 0;
    }
}

static int kx_too_small(PyObject *names, Py_ssize_t i, Py_ssize_t have, Py_ssize_t need)
{
    PyErr_Format(PyExc_TypeError, "%U: the object has %zd bytes, the C parameter points to %zd",
                 PyTuple_GET_ITEM(names, i), have, need);
    return -1;
}

/* o as a pointer argument (see the rules above). writable: the C parameter
 * is not const; need: the element's size for a pointer to one element, else
 * 0. */
static inline int kx_pointer(PyObject *o, PyObject *names, Py_ssize_t i, int writable, Py_ssize_t need, kx_ptr *out)
{
    if (Py_IS_TYPE(o, kx_carg_type)) {
        kx_carg *a = (kx_carg *)o;
        if (a->tag != 'P') {
            PyErr_Format(PyExc_TypeError, "%U: expected a pointer, got a ctypes argument of tag %c",
                         PyTuple_GET_ITEM(names, i), a->tag);
            return -1;
        }
        out->p = a->value.p;
        if (need && a->obj && PyObject_TypeCheck(a->obj, kx_cdata_type)) {
            kx_cdata *d = (kx_cdata *)a->obj;
            Py_ssize_t have = d->b_size - ((char *)a->value.p - d->b_ptr);
            if (have < need)
                return kx_too_small(names, i, have, need);
        }
        return 0;
    }
    if (o == Py_None) {
        out->p = NULL;
        return 0;
    }
    if (PyLong_CheckExact(o)) {
        out->p = PyLong_AsVoidPtr(o);
        return (out->p == NULL && PyErr_Occurred()) ? -1 : 0;
    }
    if (PyObject_TypeCheck(o, kx_cdata_type)) {
        kx_cdata *d = (kx_cdata *)o;
        if (PyObject_TypeCheck(o, kx_pointer_type) || PyObject_TypeCheck(o, kx_funcptr_type)
            || PyObject_TypeCheck(o, kx_void_p_type) || PyObject_TypeCheck(o, kx_char_p_type)) {
            out->p = *(void **)d->b_ptr;
            return 0;
        }
        if (need && d->b_size < need)
            return kx_too_small(names, i, d->b_size, need);
        out->p = d->b_ptr;
        return 0;
    }
    if (PyBytes_Check(o) && !writable) {
        out->p = PyBytes_AS_STRING(o);
        return 0;
    }
    if (!PyBool_Check(o) && !PyBytes_Check(o) && PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, &out->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
            return -1;
        out->has_view = 1;
        if (need && out->view.len < need)
            return kx_too_small(names, i, out->view.len, need);
        out->p = out->view.buf;
        return 0;
    }
    PyErr_Format(PyExc_TypeError,
                 "%U: expected a pointer (a ctypes object, byref(), an int address, a buffer or None), got %s",
                 PyTuple_GET_ITEM(names, i), Py_TYPE(o)->tp_name);
    return -1;
}

static inline PyObject *kx_cstr_result(const char *s)
{
    if (!s)
        Py_RETURN_NONE;
    return PyBytes_FromString(s);
}

/* ---- Token sequences (kvcm._convert.tokens) ---- */

/* An exact int in int32 range as a token: 1, else 0 (nothing raised). The
 * ints of one digit (|x| < 2**30 on CPython's 30-bit digits) are read
 * without a call: through the unstable compact-int API from Python 3.12,
 * from the object's digits on 3.11 (its layout there); a call otherwise. */
static inline int kx_token_of(PyObject *item, kvcm_token *out)
{
    if (!PyLong_CheckExact(item))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)item);
        if (v < INT32_MIN || v > INT32_MAX)
            return 0;
        *out = (kvcm_token)v;
        return 1;
    }
#elif PY_VERSION_HEX >= 0x030B0000 && PYLONG_BITS_IN_DIGIT == 30
    Py_ssize_t size = Py_SIZE(item);
    if (size >= -1 && size <= 1) {
        *out = (kvcm_token)(size * (long)((PyLongObject *)item)->ob_digit[0]);
        return 1;
    }
#endif
    int overflow;
    long x = PyLong_AsLongAndOverflow(item, &overflow);
    if (overflow || x < INT32_MIN || x > INT32_MAX)
        return 0;
    *out = (kvcm_token)x;
    return 1;
}

static PyObject *kx_tokens_result(PyObject *addr, Py_ssize_t n, PyObject *keep)
{
    PyObject *t = PyTuple_New(3);
    PyObject *count = PyLong_FromSsize_t(n);
    if (!t || !count || !addr) {
        Py_XDECREF(t);
        Py_XDECREF(count);
        Py_XDECREF(addr);
        Py_XDECREF(keep);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, addr);
    PyTuple_SET_ITEM(t, 1, count);
    PyTuple_SET_ITEM(t, 2, keep);
    return t;
}

static PyObject *kx_no_tokens(void)
{
    return kx_tokens_result(Py_NewRef(Py_None), 0, Py_NewRef(Py_None));
}

static int kx_native_int32_format(const char *f)
{
    if (!f)
        return 0;
    if (*f == '@' || *f == '=')
        f++;
#if PY_LITTLE_ENDIAN
    else if (*f == '<')
        f++;
#else
    else if (*f == '>')
        f++;
#endif
    return f[0] == 'i' && f[1] == '\0';
}

/* tokens(value, name="tokens") -> (address or None, count, keep), as
 * kvcm._convert's Python conversion returns them. In C: an exact list or
 * tuple of exact ints in int32 range (packed into a bytes object, keep,
 * whose data's address is returned) and a writable C-contiguous one-dimensional buffer of native
 * int32s (passed by address; keep is a memoryview, so that the owner cannot
 * be resized during the call). Anything else, and every error, goes to the
 * Python conversion, which takes or refuses it with the same messages. */
static PyObject *kx_tokens(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "tokens() takes 1 or 2 positional arguments but %zd were given", nargs);
        return NULL;
    }
    if (!kx_tokens_slow) {
        kx_not_configured();
        return NULL;
    }
    PyObject *v = args[0];
    if (v == Py_None)
        return kx_no_tokens();
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (n == 0)
            return kx_no_tokens();
        PyObject *b = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(kvcm_token));
        if (!b)
            return NULL;
        kvcm_token *d = (kvcm_token *)PyBytes_AS_STRING(b);
        PyObject **items = PySequence_Fast_ITEMS(v);
        Py_ssize_t k;
        for (k = 0; k < n; k++) {
            if (!kx_token_of(items[k], &d[k]))
                break;
        }
        if (k == n)
            return kx_tokens_result(PyLong_FromVoidPtr(d), n, b);
        Py_DECREF(b);
    } else if (!PyBytes_Check(v) && !PyByteArray_Check(v) && PyObject_CheckBuffer(v)) {
        PyObject *mv = PyMemoryView_FromObject(v);
        if (!mv)
            PyErr_Clear();
        else {
            Py_buffer *view = PyMemoryView_GET_BUFFER(mv);
            if (view->ndim == 1 && view->itemsize == (Py_ssize_t)sizeof(kvcm_token) && !view->readonly
                && kx_native_int32_format(view->format) && PyBuffer_IsContiguous(view, 'C')) {
                Py_ssize_t n = view->shape ? view->shape[0] : view->len / view->itemsize;
                if (n == 0) {
                    Py_DECREF(mv);
                    return kx_no_tokens();
                }
                return kx_tokens_result(PyLong_FromVoidPtr(view->buf), n, mv);
            }
            Py_DECREF(mv);
        }
    }
    return PyObject_Vectorcall(kx_tokens_slow, args, (size_t)nargs, NULL);
}

/* ---- ctypes layouts ---- */

/* Checks kx_cdata and kx_carg against ctypes.addressof and sizeof, and
 * finds the ctypes types the pointer rules need. */
static int kx_check_ctypes(void)
{
    PyObject *ct = PyImport_ImportModule("ctypes");
    PyObject *arr = NULL, *arrtype = NULL, *ref = NULL, *addr = NULL, *mro = NULL;
    int ok = -1;
    if (!ct)
        return -1;
    PyObject *c_char = PyObject_GetAttrString(ct, "c_char");
    PyObject *c_int = PyObject_GetAttrString(ct, "c_int");
    PyObject *pointer = PyObject_GetAttrString(ct, "_Pointer");
    PyObject *funcptr = PyObject_GetAttrString(ct, "_CFuncPtr");
    PyObject *void_p = PyObject_GetAttrString(ct, "c_void_p");
    PyObject *char_p = PyObject_GetAttrString(ct, "c_char_p");
    if (!c_char || !c_int || !pointer || !funcptr || !void_p || !char_p)
        goto done;
    PyObject *n24 = PyLong_FromLong(24);
    arrtype = n24 ? PyNumber_Multiply(c_char, n24) : NULL;
    Py_XDECREF(n24);
    if (!arrtype)
        goto done;
    arr = PyObject_CallNoArgs(arrtype);
    if (!arr)
        goto done;
    addr = PyObject_CallMethod(ct, "addressof", "O", arr);
    ref = PyObject_CallMethod(ct, "byref", "Oi", arr, 8);
    mro = PyObject_GetAttrString(c_int, "__mro__");
    if (!addr || !ref || !mro)
        goto done;
    if (!PyTuple_Check(mro) || PyTuple_GET_SIZE(mro) < 2) {
        PyErr_SetString(PyExc_ImportError, "kvcm._kvcm_ext: unexpected ctypes class hierarchy");
        goto done;
    }
    char *base = PyLong_AsVoidPtr(addr);
    kx_cdata *d = (kx_cdata *)arr;
    kx_carg *a = (kx_carg *)ref;
    if (d->b_ptr != base || d->b_size != 24 || a->tag != 'P' || a->value.p != base + 8 || a->obj != arr) {
        PyErr_SetString(PyExc_ImportError,
                        "kvcm._kvcm_ext: this Python's ctypes objects are laid out differently; "
                        "kvcm uses its ctypes path");
        goto done;
    }
    kx_carg_type = (PyTypeObject *)Py_NewRef(Py_TYPE(ref));
    kx_cdata_type = (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(mro, PyTuple_GET_SIZE(mro) - 2));
    kx_pointer_type = (PyTypeObject *)Py_NewRef(pointer);
    kx_funcptr_type = (PyTypeObject *)Py_NewRef(funcptr);
    kx_void_p_type = (PyTypeObject *)Py_NewRef(void_p);
    kx_char_p_type = (PyTypeObject *)Py_NewRef(char_p);
    ok = 0;
done:
    Py_XDECREF(c_char);
    Py_XDECREF(c_int);
    Py_XDECREF(pointer);
    Py_XDECREF(funcptr);
    Py_XDECREF(void_p);
    Py_XDECREF(char_p);
    Py_XDECREF(arrtype);
    Py_XDECREF(arr);
    Py_XDECREF(addr);
    Py_XDECREF(ref);
    Py_XDECREF(mro);
    Py_DECREF(ct);
    return ok;
}

/* ---- Module functions ---- */

static PyObject *kx_configure(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *kw[] = {"load", "integer", "tokens", "check_not_forked", "release_deferred", "deferred",
                         "errors", "base_error", NULL};
    PyObject *load, *integer, *tokens, *check_fork, *release, *deferred, *errors, *base;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOO!O!", kw, &load, &integer, &tokens, &check_fork,
                                     &release, &deferred, &PyDict_Type, &errors, &PyType_Type, &base))
        return NULL;
    if (!PyObject_HasAttrString(deferred, "popleft")) {
        PyErr_SetString(PyExc_TypeError, "deferred: expected a collections.deque");
        return NULL;
    }
    Py_XSETREF(kx_load_hook, Py_NewRef(load));
    Py_XSETREF(kx_integer, Py_NewRef(integer));
    Py_XSETREF(kx_tokens_slow, Py_NewRef(tokens));
    Py_XSETREF(kx_check_fork, Py_NewRef(check_fork));
    Py_XSETREF(kx_deferred, Py_NewRef(deferred));
    Py_XSETREF(kx_errors, Py_NewRef(errors));
    Py_XSETREF(kx_base_error, Py_NewRef(base));
    Py_XSETREF(kx_release, Py_NewRef(release));
    Py_RETURN_NONE;
}

/* kx_table_at(get_api_address, what): the function table of the library whose
 * kvcm_get_api is at that address, for this extension's ABI version; an
 * ImportError (ValueError for a NULL address) naming what when it has none. */
static const kvcm_api *kx_table_at(PyObject *arg, const char *what)
{
    void *fp = PyLong_AsVoidPtr(arg);
    if (!fp) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%s: kvcm_get_api's address is NULL", what);
        return NULL;
    }
    const kvcm_api *api = ((const kvcm_api *(*)(uint32_t))fp)(KVCM_ABI_VERSION);
    if (!api || api->struct_size < sizeof(kvcm_api)) {
        PyErr_Format(PyExc_ImportError, "kvcm._kvcm_ext: the library has no function table for ABI version %d",
                     (int)KVCM_ABI_VERSION);
        return NULL;
    }
    return api;
}

/* attach(get_api_address): use the library whose kvcm_get_api is there. */
static PyObject *kx_attach(PyObject *module, PyObject *arg)
{
    (void)module;
    const kvcm_api *api = kx_table_at(arg, "attach");
    if (!api)
        return NULL;
    kx_api = api;
    Py_RETURN_NONE;
}

static PyObject *kx_mark_forked(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    kx_forked = 1;
    Py_RETURN_NONE;
}
