package gen

import (
	_ "embed"
	"fmt"
	"strings"
)

func init() { emitters = append(emitters, emitPyExt) }

// pyExtRuntime is the hand-written part of the extension (argument
// conversion, status raising, token sequences, the library's function
// table), copied into the generated file.
//
//go:embed pyext/runtime.c
var pyExtRuntime string

// pyExtStep is the KV cache's decode step (the CacheStep type), copied into
// the generated file when the ABI has the three functions it calls.
//
//go:embed pyext/step.c
var pyExtStep string

// pyExtStepSlots are the functions CacheStep calls, by the macro naming
// their table slot in pyext/step.c.
var pyExtStepSlots = [][2]string{
	{"KX_STEP_RESIZE", "kvcm_kv_cache_resize"}, {"KX_STEP_COMMIT", "kvcm_kv_cache_commit"},
	{"KX_STEP_DECODE", "kvcm_kv_cache_decode_steps"},
}

func emitPyExt(m *Model, p Paths) (map[string][]byte, error) {
	if p.PyExt == "" {
		return nil, nil
	}
	return map[string][]byte{p.PyExt: []byte(EmitPyExt(m, p.Include))}, nil
}

// EmitPyExt writes the CPython extension module kvcm._kvcm_ext: one
// METH_FASTCALL function per function of the API table whose parameter and
// result types it can convert (the others keep the ctypes path), with
// kvcm._native.bind's argument rules, calling the library through the
// function table of the library kvcm._native loaded.
func EmitPyExt(m *Model, include string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "/* %s */\n\n", Banner)
	b.WriteString(`/* kvcm._kvcm_ext: the compiled fast path of the Python binding, generated from
 * the ABI description (gen/abi) with the ctypes layer (_ffi.py).
 * kvcm._native.bind(name) returns bind(name, parameter_names) of this module
 * when it is importable: a builtin function calling the C function with the
 * ctypes path's argument rules; kvcm._convert.tokens is tokens(). Functions
 * missing here (see functions()) keep the ctypes path. Built by setup.py
 * (pip install, make py-test); not linked to libkvcm. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

`)
	fmt.Fprintf(&b, "#include \"%s\"\n\n", include)
	b.WriteString(pyExtRuntime)
	b.WriteString("\n/* ---- The functions ---- */\n")

	slots, _ := m.APILayout()
	var done []APISlot
	for _, s := range slots {
		body, ok := pyExtFunc(s)
		if !ok {
			fmt.Fprintf(&b, "\n/* %s: no fast path (a parameter or result type the extension does not convert). */\n", s.Func.CName)
			continue
		}
		b.WriteString("\n" + body)
		done = append(done, s)
	}

	b.WriteString("\nstatic PyMethodDef kx_functions[] = {\n")
	for _, s := range done {
		fmt.Fprintf(&b, "    {%q, (PyCFunction)(void (*)(void))kx_fn_%s, METH_FASTCALL, %q},\n",
			s.Func.CName, s.Func.CName, s.Func.CName+"("+pyExtParamNames(s.Func)+")")
	}
	b.WriteString("    {NULL, NULL, 0, NULL},\n};\n\nstatic const Py_ssize_t kx_arity[] = {")
	for i, s := range done {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d", len(s.Func.Sig.Params))
	}
	if len(done) == 0 {
		b.WriteString("0")
	}
	b.WriteString("};\n\nstatic const size_t kx_slot_offsets[] = {")
	for i, s := range done {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "\n    offsetof(kvcm_api, %s)", s.Name)
	}
	if len(done) == 0 {
		b.WriteString("0")
	}
	b.WriteString("\n};\n")
	b.WriteString(pyExtStepType(done))
	b.WriteString(pyExtModule)
	return b.String()
}

// pyExtStepType renders the CacheStep type (pyext/step.c) with the table
// slots of the functions it calls, when those have a fast path (so the slot
// check of kvcm._native covers them), else a kx_add_types adding nothing.
func pyExtStepType(done []APISlot) string {
	var defs strings.Builder
	for _, want := range pyExtStepSlots {
		found := false
		for _, s := range done {
			if s.Func.CName == want[1] {
				fmt.Fprintf(&defs, "#define %s %s\n", want[0], s.Name)
				found = true
			}
		}
		if !found {
			return "\n/* No CacheStep type: the ABI has no " + want[1] + " with a fast path. */\n" +
				"static int kx_add_types(PyObject *module)\n{\n    (void)module;\n    return 0;\n}\n"
		}
	}
	return "\n" + defs.String() + pyExtStep
}

func pyExtParamNames(f *Func) string {
	var names []string
	for _, p := range f.Sig.Params {
		names = append(names, p.CName)
	}
	return strings.Join(names, ", ")
}

// pyExtScalar describes an integer, bool or floating type: its C name in
// messages (kvcm._convert's: int<bits>_t or uint<bits>_t), whether it is
// signed, and its kind ("int", "bool", "double").
func pyExtScalar(t *Type) (ctname string, signed bool, kind string, ok bool) {
	switch t.Kind {
	case KSize:
		return "uint64_t", false, "int", true
	case KNamed:
		switch t.Decl.Kind {
		case DEnum, DTypedef, DHandle:
			return pyExtScalar(t.Decl.Base)
		}
		return "", false, "", false
	case KScalar:
		switch t.Scalar {
		case "bool":
			return "", false, "bool", true
		case "double", "float":
			return "", false, "double", true
		case "uintptr_t":
			return "uint64_t", false, "int", true
		}
		if strings.HasPrefix(t.Scalar, "int") || strings.HasPrefix(t.Scalar, "uint") {
			return t.Scalar, strings.HasPrefix(t.Scalar, "int"), "int", true
		}
	}
	return "", false, "", false
}

// pyExtBounds renders the C range of an integer type named like int32_t.
func pyExtBounds(ctname string, signed bool) (lo, hi string) {
	bits := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(ctname, "u"), "int"), "_t")
	if signed {
		return "INT" + bits + "_MIN", "INT" + bits + "_MAX"
	}
	return "0", "UINT" + bits + "_MAX"
}

// pyExtPointer reports whether a value of t is passed as a pointer, whether
// the pointee may be written, and the size of the one element it points to
// (0 when unknown, or when count gives the number of elements).
func pyExtPointer(t *Type, count string) (writable bool, need int, ok bool) {
	switch t.Kind {
	case KPtr:
		if count == "" && !(t.Elem.Kind == KNamed && t.Elem.Decl.Kind == DOpaque) && t.Elem.Kind != KVoid {
			need, _ = t.Elem.sizeAlign()
		}
		return t.Dir != DirIn, need, true
	case KCStr, KConstVoidPtr:
		return false, 0, true
	case KVoidPtr:
		return true, 0, true
	case KNamed:
		return false, 0, t.Decl.Kind == DCallback
	}
	return false, 0, false
}

// pyExtFunc renders the extension function of a table slot, or false when a
// parameter or the result has a type it does not convert.
func pyExtFunc(s APISlot) (string, bool) {
	f := s.Func
	var decls, convs, args []string
	for i, p := range f.Sig.Params {
		a := fmt.Sprintf("a%d", i)
		ctype := p.Type.CName()
		if ctname, signed, kind, ok := pyExtScalar(p.Type); ok {
			decls = append(decls, fmt.Sprintf("    %s %s;", ctype, a))
			args = append(args, a)
			switch kind {
			case "bool":
				convs = append(convs, fmt.Sprintf("    if (kx_bool(args[%d], &%s) < 0)\n        goto done;", i, a))
			case "double":
				convs = append(convs, fmt.Sprintf("    if (kx_double(args[%d], names, %d, &%s) < 0)\n        goto done;", i, i, a))
			case "int":
				lo, hi := pyExtBounds(ctname, signed)
				if signed {
					convs = append(convs, fmt.Sprintf("    {\n        long long v;\n        if (kx_signed(args[%d], names, %d, %s, %s, %q, &v) < 0)\n            goto done;\n        %s = (%s)v;\n    }",
						i, i, lo, hi, ctname, a, ctype))
				} else {
					convs = append(convs, fmt.Sprintf("    {\n        unsigned long long v;\n        if (kx_unsigned(args[%d], names, %d, %s, %q, &v) < 0)\n            goto done;\n        %s = (%s)v;\n    }",
						i, i, hi, ctname, a, ctype))
				}
			}
			continue
		}
		writable, need, ok := pyExtPointer(p.Type, p.Len)
		if !ok {
			return "", false
		}
		decls = append(decls, fmt.Sprintf("    kx_ptr %s = KX_PTR_INIT;", a))
		convs = append(convs, fmt.Sprintf("    if (kx_pointer(args[%d], names, %d, %d, %d, &%s) < 0)\n        goto done;",
			i, i, map[bool]int{true: 1, false: 0}[writable], need, a))
		args = append(args, fmt.Sprintf("(%s)%s.p", ctype, a))
	}

	res := f.Sig.Result
	var call, result string
	switch {
	case res.IsStatus():
		decls = append(decls, "    kvcm_status *r;")
		call = "r = "
		result = "kx_leave(r, Py_NewRef(Py_None))"
	case res.Kind == KVoid:
		result = "kx_leave(NULL, Py_NewRef(Py_None))"
	case res.Kind == KCStr:
		decls = append(decls, "    const char *r;")
		call = "r = "
		result = "kx_leave(NULL, kx_cstr_result(r))"
	default:
		_, signed, kind, ok := pyExtScalar(res)
		if !ok {
			return "", false
		}
		decls = append(decls, fmt.Sprintf("    %s r;", res.CName()))
		call = "r = "
		switch {
		case kind == "bool":
			result = "kx_leave(NULL, PyBool_FromLong(r))"
		case kind == "double":
			result = "kx_leave(NULL, PyFloat_FromDouble(r))"
		case signed:
			result = "kx_leave(NULL, PyLong_FromLongLong((long long)r))"
		default:
			result = "kx_leave(NULL, PyLong_FromUnsignedLongLong((unsigned long long)r))"
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "/* %s(%s) */\n", f.CName, pyExtParamNames(f))
	fmt.Fprintf(&b, "static PyObject *kx_fn_%s(PyObject *names, PyObject *const *args, Py_ssize_t nargs)\n{\n", f.CName)
	for _, d := range decls {
		b.WriteString(d + "\n")
	}
	b.WriteString("    PyObject *out = NULL;\n")
	if len(f.Sig.Params) == 0 {
		b.WriteString("    (void)names;\n    (void)args;\n")
	}
	fmt.Fprintf(&b, "    if (kx_enter(nargs, %d, %q) < 0)\n        return NULL;\n", len(f.Sig.Params), f.CName)
	for _, c := range convs {
		b.WriteString(c + "\n")
	}
	b.WriteString("    Py_BEGIN_ALLOW_THREADS\n")
	fmt.Fprintf(&b, "    %skx_api->%s(%s);\n", call, s.Name, strings.Join(args, ", "))
	b.WriteString("    Py_END_ALLOW_THREADS\n")
	for i, p := range f.Sig.Params {
		if _, _, _, ok := pyExtScalar(p.Type); !ok {
			fmt.Fprintf(&b, "    kx_ptr_release(&a%d);\n", i)
		}
	}
	fmt.Fprintf(&b, "    out = %s;\n", result)
	if len(f.Sig.Params) > 0 {
		b.WriteString("done:\n")
		for i, p := range f.Sig.Params {
			if _, _, _, ok := pyExtScalar(p.Type); !ok {
				fmt.Fprintf(&b, "    kx_ptr_release(&a%d);\n", i)
			}
		}
	}
	b.WriteString("    return out;\n}\n")
	return b.String(), true
}

// pyExtModule is the module's tail: bind(), functions() and the module
// definition, after the generated kx_functions and kx_arity.
const pyExtModule = `
/* bind(name, parameter_names) -> the builtin function of name; its errors
 * name the parameters as parameter_names (a tuple of str, one a
 * parameter). KeyError when name has no fast path. */
static PyObject *kx_bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bind(name: str, parameter_names: tuple)");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (!name)
        return NULL;
    for (Py_ssize_t i = 0; kx_functions[i].ml_name; i++) {
        if (strcmp(kx_functions[i].ml_name, name))
            continue;
        if (PyTuple_GET_SIZE(args[1]) != kx_arity[i]) {
            PyErr_Format(PyExc_ValueError, "bind: %s has %zd parameters, got %zd names", name, kx_arity[i],
                         PyTuple_GET_SIZE(args[1]));
            return NULL;
        }
        for (Py_ssize_t k = 0; k < kx_arity[i]; k++) {
            if (!PyUnicode_Check(PyTuple_GET_ITEM(args[1], k))) {
                PyErr_SetString(PyExc_TypeError, "bind: parameter names must be str");
                return NULL;
            }
        }
        return PyCFunction_NewEx(&kx_functions[i], args[1], module);
    }
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

/* The number of functions with a fast path (kx_functions without its end). */
static Py_ssize_t kx_num_functions(void)
{
    Py_ssize_t n = 0;
    while (kx_functions[n].ml_name)
        n++;
    return n;
}

/* functions() -> the names of the functions with a fast path. */
static PyObject *kx_names(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    Py_ssize_t n = kx_num_functions();
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(kx_functions[i].ml_name);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* slots(get_api_address) -> the addresses the table of the library whose
 * kvcm_get_api is there holds at this extension's slots, in functions()'s
 * order: kvcm._native compares them with the library's symbols before
 * attach, so an extension built against another header than the library's
 * (slots shifted within an unreleased ABI version) is refused, not called. */
static PyObject *kx_slots(PyObject *module, PyObject *arg)
{
    (void)module;
    const kvcm_api *api = kx_table_at(arg, "slots");
    if (!api)
        return NULL;
    Py_ssize_t n = kx_num_functions();
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        void *slot;
        memcpy(&slot, (const char *)api + kx_slot_offsets[i], sizeof slot);
        PyObject *v = PyLong_FromVoidPtr(slot);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyMethodDef kx_module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))kx_configure, METH_VARARGS | METH_KEYWORDS,
     "configure(*, load, integer, tokens, check_not_forked, release_deferred, deferred, errors, base_error)"},
    {"attach", kx_attach, METH_O, "attach(get_api_address): call through this library's function table"},
    {"mark_forked", kx_mark_forked, METH_NOARGS, "mark_forked(): this process is a fork() child"},
    {"bind", (PyCFunction)(void (*)(void))kx_bind, METH_FASTCALL, "bind(name, parameter_names)"},
    {"functions", kx_names, METH_NOARGS, "functions(): the names with a fast path"},
    {"slots", kx_slots, METH_O, "slots(get_api_address): the library table's addresses at functions()'s slots"},
    {"tokens", (PyCFunction)(void (*)(void))kx_tokens, METH_FASTCALL,
     "tokens(value, name='tokens') -> (address or None, count, keep), as kvcm._convert.tokens"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kx_module = {
    PyModuleDef_HEAD_INIT, "_kvcm_ext", "kvcm's compiled fast path (generated by kvcmgen)", -1, kx_module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvcm_ext(void)
{
    if (kx_check_ctypes() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&kx_module);
    if (module && kx_add_types(module) < 0)
        Py_CLEAR(module);
    return module;
}
`
