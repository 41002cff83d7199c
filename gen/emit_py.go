package gen

import (
	"fmt"
	"slices"
	"strings"
)

func init() { emitters = append(emitters, emitPy) }

func emitPy(m *Model, p Paths) (map[string][]byte, error) {
	return map[string][]byte{p.Python: []byte(EmitPython(m))}, nil
}

var pyScalars = map[string]string{
	"int8_t": "ctypes.c_int8", "int16_t": "ctypes.c_int16", "int32_t": "ctypes.c_int32", "int64_t": "ctypes.c_int64",
	"uint8_t": "ctypes.c_uint8", "uint16_t": "ctypes.c_uint16", "uint32_t": "ctypes.c_uint32", "uint64_t": "ctypes.c_uint64",
	"float": "ctypes.c_float", "double": "ctypes.c_double", "bool": "ctypes.c_bool", "uintptr_t": "ctypes.c_uint64",
}

// pyType renders the ctypes type of t; slot names the CFUNCTYPE of a vtable
// field.
func pyType(t *Type, slot string) string {
	switch t.Kind {
	case KVoid:
		return "None"
	case KScalar:
		return pyScalars[t.Scalar]
	case KSize:
		return "ctypes.c_size_t"
	case KNamed:
		return t.Decl.CName
	case KPtr:
		if t.Elem.Kind == KNamed && t.Elem.Decl.Kind == DOpaque && t.Elem.Decl.APITable {
			return "ctypes.c_void_p"
		}
		return "ctypes.POINTER(" + pyType(t.Elem, "") + ")"
	case KCStr:
		return "ctypes.c_char_p"
	case KVoidPtr, KConstVoidPtr:
		return "ctypes.c_void_p"
	case KFunc:
		return slot
	}
	panic(fmt.Sprintf("gen: no ctypes type for kind %d", t.Kind))
}

// pyBytesType is the ctypes type of a length-delimited const char* (one with
// a len): an address, not c_char_p, which ctypes would read (and, for a
// callback argument, convert to bytes) up to the first NUL.
const pyBytesType = "ctypes.c_void_p"

// pyParamType renders the ctypes type of a parameter.
func pyParamType(p *Param) string {
	if p.Type.Kind == KCStr && p.Len != "" {
		return pyBytesType
	}
	return pyType(p.Type, "")
}

// pyFieldType renders the ctypes type of a struct field; slot names the
// CFUNCTYPE of a vtable field.
func pyFieldType(f *Field, slot string) string {
	if f.Type.Kind == KCStr && f.Len != "" {
		return pyBytesType
	}
	return pyType(f.Type, slot)
}

func pyFuncType(s *Sig) string {
	parts := []string{pyType(s.Result, "")}
	for _, p := range s.Params {
		parts = append(parts, pyParamType(p))
	}
	return "ctypes.CFUNCTYPE(" + strings.Join(parts, ", ") + ")"
}

func pyComment(b *strings.Builder, indent, text string) {
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			b.WriteString(indent + "#\n")
		} else {
			b.WriteString(indent + "# " + line + "\n")
		}
	}
}

func pyDocstring(b *strings.Builder, indent, text string) {
	text = strings.ReplaceAll(text, `\`, `\\`)
	text = strings.ReplaceAll(text, `"""`, `\"\"\"`)
	lines := strings.Split(text, "\n")
	b.WriteString(indent + `"""` + lines[0])
	if len(lines) == 1 {
		b.WriteString(`"""` + "\n")
		return
	}
	b.WriteString("\n")
	for _, l := range lines[1:] {
		if l == "" {
			b.WriteString("\n")
		} else {
			b.WriteString(indent + l + "\n")
		}
	}
	b.WriteString(indent + `"""` + "\n")
}

// EmitPython writes the ctypes layer: constants, enums (IntEnum classes and
// the C-named constants), typedefs, Structures with _fields_ matching the
// header, callback types, the prototypes of every function, a loader and
// the expected layouts with a checker.
func EmitPython(m *Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", Banner)
	pyDocstring(&b, "", `ctypes layer of libkvcm, generated from the ABI description (gen/abi).

Low level: the names are the C names of include/kvcm/kvcm.h. load() opens the
library (the path given, else $KVCM_LIBRARY, else libkvcm.so next to this
package, else the system search path), sets argtypes and restype of every
function and checks the library's ABI version. check_layouts() compares the
ctypes layouts with the ones the header freezes.`)
	b.WriteString("\nimport ctypes\nimport ctypes.util\nimport enum\nimport os\n")
	if slices.ContainsFunc(m.Decls, func(d *Decl) bool { return d.PyValue }) {
		b.WriteString("from dataclasses import dataclass\n")
	}
	b.WriteString("\n")

	b.WriteString("# ---- Constants ----\n\n")
	for _, c := range m.Consts {
		pyComment(&b, "", c.Doc)
		if c.Str {
			fmt.Fprintf(&b, "%s = %q\n\n", c.CName, c.Value)
		} else {
			fmt.Fprintf(&b, "%s = %s\n\n", c.CName, c.Value)
		}
	}

	b.WriteString("# ---- Scalar types and handles ----\n\n")
	for _, d := range m.Decls {
		if d.Kind == DTypedef || d.Kind == DHandle || d.Kind == DEnum {
			fmt.Fprintf(&b, "%s = %s\n", d.CName, pyType(d.Base, ""))
		}
	}

	b.WriteString("\n# ---- Enumerations ----\n\n")
	for _, d := range m.Decls {
		if d.Kind != DEnum {
			continue
		}
		fmt.Fprintf(&b, "\nclass %s(enum.IntEnum):\n", d.CppName)
		pyDocstring(&b, "    ", d.Doc)
		b.WriteString("\n")
		for _, e := range d.Members {
			fmt.Fprintf(&b, "    %s = %d\n", e.PyName, e.Value)
		}
		b.WriteString("\n\n")
		if d.PyEnum != "" {
			fmt.Fprintf(&b, "class %s(enum.IntEnum):\n", d.PyEnum)
			pyDocstring(&b, "    ", d.Doc+"\n\n"+d.CppName+" with the Python binding's names (//kvcm:pyenum).")
			b.WriteString("\n")
			for _, e := range d.Members {
				name := e.PyName
				if to := d.PyEnumNames[name]; to != "" {
					name = to
				}
				fmt.Fprintf(&b, "    %s = %d\n", name, e.Value)
			}
			b.WriteString("\n\n")
		}
		for _, e := range d.Members {
			fmt.Fprintf(&b, "%s = %d\n", e.CName, e.Value)
		}
	}

	b.WriteString("\n\n# ---- Opaque types and callbacks ----\n\n")
	for _, d := range m.Decls {
		if d.Kind == DOpaque {
			fmt.Fprintf(&b, "\nclass %s(ctypes.Structure):\n", d.CName)
			pyDocstring(&b, "    ", d.Doc)
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	for _, d := range m.Decls {
		if d.Kind == DCallback {
			pyComment(&b, "", d.Doc)
			fmt.Fprintf(&b, "%s = %s\n\n", d.CName, pyFuncType(d.Callback))
		}
	}

	b.WriteString("# ---- Structures (declared first, fields set below, so pointers may refer forward) ----\n\n")
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		fmt.Fprintf(&b, "\nclass %s(ctypes.Structure):\n", d.CName)
		pyDocstring(&b, "    ", d.Doc)
		if d.Align > 0 {
			fmt.Fprintf(&b, "\n    _align_ = %d  # honoured by Python 3.13+\n", d.Align)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		for _, f := range d.Fields {
			if f.Type.Kind == KFunc {
				fmt.Fprintf(&b, "%s_%s = %s\n", d.CName, f.CName, pyFuncType(f.Type.Sig))
			}
		}
		fmt.Fprintf(&b, "%s._fields_ = [\n", d.CName)
		for _, f := range d.Fields {
			fmt.Fprintf(&b, "    (%q, %s),\n", f.CName, pyFieldType(f, d.CName+"_"+f.CName))
		}
		b.WriteString("]\n\n")
	}
	pyValues(&b, m)

	b.WriteString("# ---- Layouts frozen by the header: name -> (size, alignment, {field: offset}) ----\n\nLAYOUTS = {\n")
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		var offs []string
		for _, f := range d.Fields {
			offs = append(offs, fmt.Sprintf("%q: %d", f.CName, f.Offset))
		}
		fmt.Fprintf(&b, "    %q: (%d, %d, {%s}),\n", d.CName, d.size, d.align, strings.Join(offs, ", "))
	}
	b.WriteString("}\n\n")
	b.WriteString(`
def check_layouts():
    """Return a list of mismatches between the ctypes Structures and LAYOUTS (empty when all match).

    Alignment is not compared for structs whose C alignment ctypes cannot
    express (kvcm_page_index_pair is alignas(8) in C; ctypes gives it 4 unless
    the Python version supports _align_); it is only ever used through
    pointers.
    """
    problems = []
    for name, (size, _align, offsets) in LAYOUTS.items():
        cls = globals()[name]
        if ctypes.sizeof(cls) != size:
            problems.append("%s: sizeof %d, header says %d" % (name, ctypes.sizeof(cls), size))
        for field, off in offsets.items():
            got = getattr(cls, field).offset
            if got != off:
                problems.append("%s.%s: offset %d, header says %d" % (name, field, got, off))
    return problems

`)
	b.WriteString("\n# ---- Functions: name -> (restype, argtypes) ----\n\nFUNCTIONS = {\n")
	for _, f := range m.Funcs {
		var args []string
		for _, p := range f.Sig.Params {
			args = append(args, pyParamType(p))
		}
		fmt.Fprintf(&b, "    %q: (%s, [%s]),\n", f.CName, pyType(f.Sig.Result, ""), strings.Join(args, ", "))
	}
	b.WriteString("}\n\n")
	b.WriteString("# Parameter names, in order, for error messages and docs.\nPARAMETERS = {\n")
	for _, f := range m.Funcs {
		var names []string
		for _, p := range f.Sig.Params {
			names = append(names, fmt.Sprintf("%q", p.CName))
		}
		fmt.Fprintf(&b, "    %q: (%s),\n", f.CName, strings.Join(names, ", ")+map[bool]string{true: ",", false: ""}[len(names) == 1])
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, `

LIBRARY_ENV = "KVCM_LIBRARY"


def library_path():
    """Return the path of libkvcm that load() opens by default, or None."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libkvcm.so", "libkvcm.dylib"):
        candidate = os.path.join(here, name)
        if os.path.exists(candidate):
            return candidate
    return ctypes.util.find_library("kvcm")


def load(path=None):
    """Open libkvcm, declare every function's prototype and check the ABI version.

    Raises OSError when the library cannot be found or is older than this
    layer (its kvcm_get_abi_version() is below %[1]s_ABI_VERSION).
    """
    path = path or library_path()
    if not path:
        raise OSError("libkvcm not found: set %%s or install the kvcm package with its library" %% LIBRARY_ENV)
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.%[2]s_get_abi_version()
    if version < %[1]s_ABI_VERSION:
        raise OSError("%%s implements ABI version %%d, this layer needs %%d" %% (path, version, %[1]s_ABI_VERSION))
    return lib
`, strings.ToUpper(m.Prefix), m.Prefix)
	return b.String()
}

// pyValueField is a field of a //kvcm:pyvalue type.
type pyValueField struct{ name, typ, conv, doc, def string }

// pyValueFields lists the fields of d's //kvcm:pyvalue type: the C
// struct's (enums as their IntEnum, its //kvcm:pyenum if any, an array of scalars with its count as a
// tuple; counts are not fields) in its order or the one of //kvcm:pyvalue
// order=a,b,... (py:"name" renames a field, py:"-" leaves it out,
// pydefault:"v" gives its default; prefix=p starts every name, counters
// makes every default 0), with the expression _from_c reads each from.
func pyValueFields(d *Decl) ([]pyValueField, error) {
	cnt := counts(d)
	var fields []pyValueField
	for _, f := range d.Fields {
		if cnt[f.CName] || f.Py == "-" {
			continue
		}
		name := d.PyValuePrefix + f.CName
		if f.Py != "" {
			name = f.Py
		}
		t, conv := "int", "s."+f.CName
		switch {
		case f.Type.Kind == KScalar && (f.Type.Scalar == "double" || f.Type.Scalar == "float"):
			t = "float"
		case f.Type.Kind == KScalar && f.Type.Scalar == "bool":
			t = "bool"
		case f.Type.Kind == KNamed && f.Type.Decl.Kind == DEnum:
			t = f.Type.Decl.CppName
			if f.Type.Decl.PyEnum != "" {
				t = f.Type.Decl.PyEnum
			}
			conv = t + "(s." + f.CName + ")"
		case f.Type.Kind == KPtr && f.Type.Dir == DirIn && f.Len != "" && isScalarField(f.Type.Elem):
			t = "tuple[int, ...]"
			conv = fmt.Sprintf("tuple(s.%s[:s.%s]) if s.%s else ()", f.CName, f.Len, f.Len)
		case !isScalarField(f.Type):
			return nil, fmt.Errorf("%s.%s: a //kvcm:pyvalue struct has scalar, enum and typedef fields only (and arrays of them with a count)", d.GoName, f.GoName)
		}
		def := f.PyDefault
		if d.PyValueCounters && def == "" {
			if t != "int" {
				return nil, fmt.Errorf("%s.%s: a //kvcm:pyvalue counters struct has int fields only (or a pydefault)", d.GoName, f.GoName)
			}
			def = "0"
		}
		fields = append(fields, pyValueField{name, t, conv, renamed(f.Doc, f.CName, name), def})
	}
	if len(d.PyValueOrder) == 0 {
		return fields, nil
	}
	if len(d.PyValueOrder) != len(fields) {
		return nil, fmt.Errorf("%s: //kvcm:pyvalue order= names %d fields, the value type has %d", d.GoName, len(d.PyValueOrder), len(fields))
	}
	ordered := make([]pyValueField, 0, len(fields))
	for _, name := range d.PyValueOrder {
		i := slices.IndexFunc(fields, func(f pyValueField) bool { return f.name == name })
		if i < 0 {
			return nil, fmt.Errorf("%s: //kvcm:pyvalue order= names %q, not a field of the value type", d.GoName, name)
		}
		ordered = append(ordered, fields[i])
	}
	return ordered, nil
}

// pyValues writes the value types of //kvcm:pyvalue structs (see
// pyValueFields; the loader checked them): frozen dataclasses (mutable ones
// for counters), and _from_c, which copies them from the C struct (or the
// extension's object of the same fields).
func pyValues(b *strings.Builder, m *Model) {
	first := true
	for _, d := range m.Decls {
		if !d.PyValue {
			continue
		}
		if first {
			b.WriteString("# ---- Value types ----\n\n")
			first = false
		}
		fields, err := pyValueFields(d)
		if err != nil {
			panic(err) // checked by the loader
		}
		name, dc := d.CppName, "frozen=True, slots=True"
		if d.PyValueName != "" {
			name = d.PyValueName
		}
		if d.PyValueCounters {
			dc = "slots=True"
		}
		fmt.Fprintf(b, "\n@dataclass(%s)\nclass %s:\n", dc, name)
		pyDocstring(b, "    ", d.Doc)
		b.WriteString("\n")
		var args []string
		for _, f := range fields {
			for _, line := range strings.Split(f.doc, "\n") {
				fmt.Fprintf(b, "    #: %s\n", line)
			}
			if f.def != "" {
				fmt.Fprintf(b, "    %s: %s = %s\n", f.name, f.typ, f.def)
			} else {
				fmt.Fprintf(b, "    %s: %s\n", f.name, f.typ)
			}
			args = append(args, f.conv)
		}
		fmt.Fprintf(b, "\n    @classmethod\n    def _from_c(cls, s):\n")
		fmt.Fprintf(b, "        \"\"\"Copies the fields of a %s (or of an object with its fields).\"\"\"\n", d.CName)
		fmt.Fprintf(b, "        return cls(%s)\n\n", strings.Join(args, ", "))
	}
}
