package gen

import (
	"fmt"
	"slices"
	"strings"
)

func init() { emitters = append(emitters, emitPyConfigs) }

// A struct with //kvcm:pyconfig <Name> [order=a,b,...] gets, in the Python
// value module (Paths.PyValues), a dataclass <Name> and its _to_c(c, path,
// keep), which writes the fields it shares with the ctypes struct c (path
// names them in errors, keep collects what c points into). The public
// classes of kvcm.config derive from these and add their behaviour. The
// fields follow the C struct's by type:
//
//   - an integer or typedef: int (set with _convert.set_field, so a
//     non-int is a TypeError and a value out of the C type's range an
//     InvalidArgumentError, both naming the field's path); a double: float;
//     a bool: bool; an enum: its _ffi IntEnum;
//   - a const char*: str (a NUL byte, where the C string would end, is an
//     InvalidConfigError naming the field);
//   - a const T* with a count: a list of T's value type, or of floats for
//     double; a nullable const T* without one: T's value type or None.
//
// Counts, struct_size and abi_version are not fields; a field tagged py:"-"
// is not one either, and //kvcm:pyfield name type [default] | doc adds one
// the C struct lacks: the hand-written binding converts both. py:"name"
// renames a field (default: its C name; errors name it so), pydefault:"v"
// gives its default (none: the field is required; None: None stands for the
// C zero, or NULL; []: an empty list, NULL in C; an enum's member name). The
// struct's //kvcm:pydoc lines replace its doc.

type pyConfigField struct {
	Name, Type, Default, Doc string
	Field                    *Field
}

func pyConfigFields(d *Decl) ([]*pyConfigField, error) {
	cnt := counts(d)
	var out []*pyConfigField
	for _, f := range d.Fields {
		if f.Py == "-" || cnt[f.CName] || (d.Versioned && (f.CName == "struct_size" || f.CName == "abi_version")) {
			continue
		}
		t, err := pyConfigType(f)
		if err != nil {
			return nil, fmt.Errorf("%s.%s (//kvcm:pyconfig): %w", d.GoName, f.GoName, err)
		}
		name := f.CName
		if f.Py != "" {
			name = f.Py
		}
		def := f.PyDefault
		switch {
		case def == "None":
			t += " | None"
		case def != "" && f.Type.Kind == KNamed && f.Type.Decl.Kind == DEnum:
			def = "_ffi." + f.Type.Decl.CppName + "." + def
		}
		out = append(out, &pyConfigField{Name: name, Type: t, Default: def, Doc: renamed(f.Doc, f.CName, name), Field: f})
	}
	for _, o := range d.PyConfig.Own {
		out = append(out, &pyConfigField{Name: o.Name, Type: o.Type, Default: o.Default, Doc: o.Doc})
	}
	if len(d.PyConfig.Order) == 0 {
		return out, nil
	}
	if len(d.PyConfig.Order) != len(out) {
		return nil, fmt.Errorf("%s: //kvcm:pyconfig order= names %d fields, the value type has %d", d.GoName, len(d.PyConfig.Order), len(out))
	}
	ordered := make([]*pyConfigField, 0, len(out))
	for _, name := range d.PyConfig.Order {
		i := slices.IndexFunc(out, func(f *pyConfigField) bool { return f.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%s: //kvcm:pyconfig order= names %q, not a field of the value type", d.GoName, name)
		}
		ordered = append(ordered, out[i])
	}
	return ordered, nil
}

// pyConfigType is the Python annotation of a field of a value type.
func pyConfigType(f *Field) (string, error) {
	t := f.Type
	switch {
	case t.Kind == KScalar && t.Scalar == "bool":
		return "bool", nil
	case t.Kind == KScalar && (t.Scalar == "double" || t.Scalar == "float"):
		return "float", nil
	case t.Kind == KScalar || t.Kind == KSize || (t.Kind == KNamed && t.Decl.Kind == DTypedef):
		return "int", nil
	case t.Kind == KNamed && t.Decl.Kind == DEnum:
		return "_ffi." + t.Decl.CppName, nil
	case t.Kind == KCStr:
		return "str", nil
	case t.Kind == KPtr && t.Dir == DirIn && f.Len != "":
		switch e := t.Elem; {
		case e.Kind == KScalar && e.Scalar == "double":
			return "list[float]", nil
		case e.Kind == KNamed && e.Decl.PyConfig != nil:
			return "list[" + e.Decl.PyConfig.Name + "]", nil
		}
	case t.Kind == KPtr && t.Dir == DirIn && f.Nullable && t.Elem.Kind == KNamed && t.Elem.Decl.PyConfig != nil:
		return t.Elem.Decl.PyConfig.Name, nil
	}
	return "", fmt.Errorf("no Python value type for %s: tag it py:\"-\" and convert it by hand", t.CName())
}

// pyConfigDecls lists the //kvcm:pyconfig structs, each after the value
// types of its fields.
func pyConfigDecls(m *Model) []*Decl {
	var out []*Decl
	seen := map[*Decl]bool{}
	var visit func(d *Decl)
	visit = func(d *Decl) {
		if seen[d] {
			return
		}
		seen[d] = true
		for _, f := range d.Fields {
			if t := f.Type; t.Kind == KPtr && t.Elem.Kind == KNamed && t.Elem.Decl.PyConfig != nil {
				visit(t.Elem.Decl)
			}
		}
		out = append(out, d)
	}
	for _, d := range m.Decls {
		if d.PyConfig != nil {
			visit(d)
		}
	}
	return out
}

func emitPyConfigs(m *Model, p Paths) (map[string][]byte, error) {
	decls := pyConfigDecls(m)
	variants, vdecls, err := pyVariantClasses(m)
	if err != nil {
		return nil, err
	}
	if p.PyValues == "" || len(decls)+len(vdecls) == 0 {
		return nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", Banner)
	b.WriteString(`"""The Python value types of kvcm's configuration structs (//kvcm:pyconfig in
gen/abi), each with _to_c, which writes the fields it shares with its ctypes
struct, and the classes of a struct split by kind (//kvcm:pyvariant), each
with _check_types and _to_c. The public classes of kvcm.config derive from
them and add their behaviour (type checks, TensorRT-LLM's names); the
fields the C struct carries elsewhere are converted there.
"""

from __future__ import annotations

import ctypes
`)
	if len(vdecls) > 0 {
		b.WriteString("import os\n")
	}
	b.WriteString("from dataclasses import dataclass, field\n")
	if len(vdecls) > 0 {
		b.WriteString("from typing import Any, Union\n")
	} else {
		b.WriteString("from typing import Any\n")
	}
	b.WriteString(`
from . import _ffi
from ._convert import set_field
from .errors import InvalidConfigError


def _path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _cstr(value: str, path: str, keep: list[Any]) -> bytes:
    """value encoded for a C string, kept alive in keep; a NUL byte (where
    the C string would end) is an InvalidConfigError naming path."""
    s = value.encode()
    at = s.find(b"\0")
    if at >= 0:
        raise InvalidConfigError(f"invalid config: {path}: contains a NUL byte at offset {at}", code=6, field=path)
    keep.append(s)
    return s
`)
	if len(vdecls) > 0 {
		b.WriteString(pyVariantHelpers)
	}
	for _, d := range decls {
		if err := pyConfigClass(&b, d); err != nil {
			return nil, err
		}
	}
	for _, d := range vdecls {
		for _, v := range variants[d] {
			pyVariantClassCode(&b, d, v)
		}
	}
	return map[string][]byte{p.PyValues: []byte(b.String())}, nil
}

func pyConfigClass(b *strings.Builder, d *Decl) error {
	fields, err := pyConfigFields(d)
	if err != nil {
		return err
	}
	doc := d.PyConfig.Doc
	if doc == "" {
		doc = d.Doc
	}
	fmt.Fprintf(b, "\n\n@dataclass(slots=True)\nclass %s:\n", d.PyConfig.Name)
	pyDocstring(b, "    ", doc)
	b.WriteString("\n")
	for _, f := range fields {
		for _, line := range strings.Split(f.Doc, "\n") {
			if line != "" {
				fmt.Fprintf(b, "    #: %s\n", line)
			}
		}
		switch f.Default {
		case "":
			fmt.Fprintf(b, "    %s: %s\n", f.Name, f.Type)
		case "[]":
			fmt.Fprintf(b, "    %s: %s = field(default_factory=list)\n", f.Name, f.Type)
		default:
			fmt.Fprintf(b, "    %s: %s = %s\n", f.Name, f.Type, f.Default)
		}
	}
	fmt.Fprintf(b, "\n    def _to_c(self, c: Any, path: str, keep: list[Any]) -> None:\n")
	fmt.Fprintf(b, "        \"\"\"Writes the fields shared with %s into c.\"\"\"\n", d.CName)
	wrote := false
	for _, f := range fields {
		cf := f.Field
		if cf == nil {
			continue
		}
		wrote = true
		v, t := "self."+f.Name, cf.Type
		where := fmt.Sprintf("_path(path, '%s')", f.Name)
		none := f.Default == "None"
		switch {
		case t.Kind == KScalar && t.Scalar == "bool":
			fmt.Fprintf(b, "        c.%s = bool(%s)\n", cf.CName, v)
		case t.Kind == KScalar && (t.Scalar == "double" || t.Scalar == "float"):
			fmt.Fprintf(b, "        c.%s = float(%s)\n", cf.CName, v)
		case t.Kind == KNamed && t.Decl.Kind == DEnum:
			fmt.Fprintf(b, "        set_field(c, %q, int(%s), %s)\n", cf.CName, v, where)
		case t.Kind == KCStr:
			fmt.Fprintf(b, "        c.%s = _cstr(%s, %s, keep)\n", cf.CName, v, where)
		case t.Kind == KPtr && cf.Len != "":
			indent := "        "
			if none {
				fmt.Fprintf(b, "        if %s is not None:\n", v)
				indent += "    "
			}
			if e := t.Elem; e.Kind == KScalar {
				fmt.Fprintf(b, "%sarr = (ctypes.c_double * max(len(%s), 1))(*%s)\n", indent, v, v)
			} else {
				fmt.Fprintf(b, "%sarr = (_ffi.%s * max(len(%s), 1))()\n", indent, e.Decl.CName, v)
				fmt.Fprintf(b, "%sfor i, e in enumerate(%s):\n", indent, v)
				fmt.Fprintf(b, "%s    e._to_c(arr[i], f\"{%s}[{i}]\", keep)\n", indent, where)
			}
			fmt.Fprintf(b, "%skeep.append(arr)\n", indent)
			if none { // None is NULL; a list is passed as given, even empty
				fmt.Fprintf(b, "%sc.%s = arr\n", indent, cf.CName)
			} else {
				fmt.Fprintf(b, "%sc.%s = arr if %s else None\n", indent, cf.CName, v)
			}
			fmt.Fprintf(b, "%sc.%s = len(%s)\n", indent, cf.Len, v)
		case t.Kind == KPtr:
			fmt.Fprintf(b, "        if %s is not None:\n", v)
			fmt.Fprintf(b, "            s = _ffi.%s()\n", t.Elem.Decl.CName)
			fmt.Fprintf(b, "            %s._to_c(s, %s, keep)\n", v, where)
			fmt.Fprintf(b, "            keep.append(s)\n            c.%s = ctypes.pointer(s)\n", cf.CName)
		case none:
			fmt.Fprintf(b, "        set_field(c, %q, 0 if %s is None else %s, %s)\n", cf.CName, v, v, where)
		default:
			fmt.Fprintf(b, "        set_field(c, %q, %s, %s)\n", cf.CName, v, where)
		}
	}
	if !wrote {
		b.WriteString("        pass\n")
	}
	return nil
}
