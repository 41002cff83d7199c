package gen

import (
	"fmt"
	"slices"
	"strings"
)

// A struct with //kvcm:pyvariant <Name> <enum field>=<member>
// fields=a[=default],... lines is split, in the Python value module, into
// one dataclass per line: the struct with the enum field fixed to member (a
// read-only property named by the field's py tag), holding only the fields
// named in fields= (their Python names, in that order, each with the
// default given there or none: required), and
// //kvcm:pyvariantfield <Name> name int|bool [default] into=<field> | doc
// fields the struct lacks, which the struct that holds an array of it (the
// parent) carries in its field into= (named in fields= too, for their
// place). A field's pytype:"path" tag makes a const char* a filesystem path
// (a str or an os.PathLike, os.fsencode'd). Each class gets:
//
//   - _check_types(path), raising TypeError naming the first field (in
//     field order) whose value is not of its type (an int that is not a
//     bool, a bool, a float, a str, a str or os.PathLike), before any
//     conversion: the messages of kvcm.config's hand-written checks;
//   - _to_c(c, parent, path, keep), which writes the member and the fields
//     into the ctypes struct c and the own fields into parent (an int with
//     _convert.set_field; a bool is or-ed in, so that it is set when any
//     element sets it), errors naming each field's path.

type pyVariantField struct {
	Name, Type, Default, Doc string
	Field                    *Field // nil: an own field
	Into                     string // an own field's C field of the parent
	Kind                     string // int, bool, float, str, path
}

type pyVariantClass struct {
	*PyVariant
	Prop, PropType, PropValue, KindC string
	Fields                           []*pyVariantField
}

func pyVariantKind(f *Field) (string, error) {
	t := f.Type
	switch {
	case f.PyType == "path" && t.Kind == KCStr:
		return "path", nil
	case f.PyType != "":
		return "", fmt.Errorf("pytype:%q: want \"path\" on a const char*", f.PyType)
	case t.Kind == KScalar && t.Scalar == "bool":
		return "bool", nil
	case t.Kind == KScalar && (t.Scalar == "double" || t.Scalar == "float"):
		return "float", nil
	case t.Kind == KScalar || t.Kind == KSize || (t.Kind == KNamed && t.Decl.Kind == DTypedef):
		return "int", nil
	case t.Kind == KCStr:
		return "str", nil
	}
	return "", fmt.Errorf("no Python variant field for %s", t.CName())
}

func resolvePyVariant(m *Model, d *Decl, v *PyVariant) (*pyVariantClass, error) {
	where := fmt.Sprintf("%s (//kvcm:pyvariant %s)", d.GoName, v.Name)
	out := &pyVariantClass{PyVariant: v}
	i := slices.IndexFunc(d.Fields, func(f *Field) bool { return f.CName == v.Kind })
	if i < 0 || d.Fields[i].Type.Kind != KNamed || d.Fields[i].Type.Decl.Kind != DEnum {
		return nil, fmt.Errorf("%s: %s is not an enum field of %s", where, v.Kind, d.CName)
	}
	kf, enum := d.Fields[i], d.Fields[i].Type.Decl
	if !slices.ContainsFunc(enum.Members, func(e *EnumMember) bool { return e.PyName == v.Member }) {
		return nil, fmt.Errorf("%s: %s is not a member of %s (its Python names: %s)", where, v.Member, enum.CName, strings.Join(pyMemberNames(enum), ", "))
	}
	out.KindC, out.Prop = kf.CName, kf.CName
	if kf.Py != "" {
		out.Prop = kf.Py
	}
	out.PropType, out.PropValue = "_ffi."+enum.CppName, "_ffi."+enum.CppName+"."+v.Member
	if enum.PyEnum != "" {
		name := v.Member
		if r, ok := enum.PyEnumNames[name]; ok {
			name = r
		}
		out.PropType, out.PropValue = "_ffi."+enum.PyEnum, "_ffi."+enum.PyEnum+"."+name
	}
	var parent *Decl
	for _, p := range m.Decls {
		if slices.ContainsFunc(p.Fields, func(f *Field) bool {
			return f.Len != "" && f.Type.Kind == KPtr && f.Type.Elem.Kind == KNamed && f.Type.Elem.Decl == d
		}) {
			parent = p
			break
		}
	}
	cnt := counts(d)
	for _, name := range v.Fields {
		pf := &pyVariantField{Name: name, Default: v.Defaults[name]}
		if j := slices.IndexFunc(v.Own, func(o *OwnField) bool { return o.Name == name }); j >= 0 {
			o := v.Own[j]
			if o.Type != "int" && o.Type != "bool" {
				return nil, fmt.Errorf("%s: own field %s: type %s, want int or bool", where, name, o.Type)
			}
			if parent == nil {
				return nil, fmt.Errorf("%s: own field %s: no struct holds an array of %s", where, name, d.CName)
			}
			into := v.Into[name]
			k := slices.IndexFunc(parent.Fields, func(f *Field) bool { return f.CName == into })
			if k < 0 {
				return nil, fmt.Errorf("%s: own field %s: into=%s is not a field of %s", where, name, into, parent.CName)
			}
			if got, _ := pyVariantKind(parent.Fields[k]); got != o.Type {
				return nil, fmt.Errorf("%s: own field %s: into=%s is not a%s field", where, name, into, map[string]string{"int": "n int", "bool": " bool"}[o.Type])
			}
			pf.Type, pf.Kind, pf.Doc, pf.Into = o.Type, o.Type, o.Doc, into
			if pf.Default == "" {
				pf.Default = o.Default
			}
		} else {
			k := slices.IndexFunc(d.Fields, func(f *Field) bool {
				return (f.Py == name || f.Py == "" && f.CName == name) && !cnt[f.CName] && f != kf
			})
			if k < 0 {
				return nil, fmt.Errorf("%s: fields= names %s, neither a field of %s nor a //kvcm:pyvariantfield", where, name, d.CName)
			}
			f := d.Fields[k]
			kind, err := pyVariantKind(f)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", where, name, err)
			}
			pf.Field, pf.Kind, pf.Doc = f, kind, renamed(f.Doc, f.CName, name)
			pf.Type = map[string]string{"int": "int", "bool": "bool", "float": "float", "str": "str", "path": `Union[str, "os.PathLike[str]"]`}[kind]
		}
		if pf.Default == "None" {
			pf.Type += " | None"
		}
		out.Fields = append(out.Fields, pf)
	}
	for _, o := range v.Own {
		if !slices.Contains(v.Fields, o.Name) {
			return nil, fmt.Errorf("%s: //kvcm:pyvariantfield %s is not named in fields=", where, o.Name)
		}
	}
	return out, nil
}

// pyVariantHelpers are the module functions of the variants' classes.
const pyVariantHelpers = `

def _check_int(path: str, v: object, *, optional: bool = False) -> None:
    """TypeError naming path unless v is an int (not a bool), or None when
    optional."""
    if optional and v is None:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{path}: expected an int, got {type(v).__name__}")


def _cpath(value: str | os.PathLike[str], path: str, keep: list[Any]) -> bytes:
    """A filesystem path encoded for a C string (os.fsencode), kept alive in
    keep; a NUL byte is an InvalidConfigError naming path."""
    s = os.fsencode(value)
    at = s.find(b"\0")
    if at >= 0:
        raise InvalidConfigError(f"invalid config: {path}: contains a NUL byte at offset {at}", code=6, field=path)
    keep.append(s)
    return s
`

func pyVariantClassCode(b *strings.Builder, d *Decl, v *pyVariantClass) {
	fmt.Fprintf(b, "\n\n@dataclass(slots=True)\nclass %s:\n", v.Name)
	pyDocstring(b, "    ", fmt.Sprintf("%s\n\n%s: the %s with %s %s (//kvcm:pyvariant).", d.Doc, v.Name, d.CName, v.KindC, v.Member))
	b.WriteString("\n")
	for _, f := range v.Fields {
		for _, line := range strings.Split(f.Doc, "\n") {
			if line != "" {
				fmt.Fprintf(b, "    #: %s\n", line)
			}
		}
		if f.Default == "" {
			fmt.Fprintf(b, "    %s: %s\n", f.Name, f.Type)
		} else {
			fmt.Fprintf(b, "    %s: %s = %s\n", f.Name, f.Type, f.Default)
		}
	}
	fmt.Fprintf(b, "\n    @property\n    def %s(self) -> %s:\n        return %s\n", v.Prop, v.PropType, v.PropValue)
	b.WriteString("\n    def _check_types(self, path: str) -> None:\n")
	b.WriteString("        \"\"\"Raises TypeError naming the first field whose value is not of its type.\"\"\"\n")
	for _, f := range v.Fields {
		val, where := "self."+f.Name, fmt.Sprintf("_path(path, '%s')", f.Name)
		check := map[string][2]string{
			"bool":  {"not isinstance(%s, bool)", "a bool"},
			"float": {"not isinstance(%[1]s, (int, float)) or isinstance(%[1]s, bool)", "a float"},
			"str":   {"not isinstance(%s, str)", "a str"},
			"path":  {"not isinstance(%s, (str, os.PathLike))", "a str or path"},
		}
		switch c, ok := check[f.Kind]; {
		case f.Kind == "int" && f.Default == "None":
			fmt.Fprintf(b, "        _check_int(%s, %s, optional=True)\n", where, val)
		case f.Kind == "int":
			fmt.Fprintf(b, "        _check_int(%s, %s)\n", where, val)
		case ok:
			fmt.Fprintf(b, "        if "+c[0]+":\n", val)
			fmt.Fprintf(b, "            raise TypeError(f\"{%s}: expected %s, got {type(%s).__name__}\")\n", where, c[1], val)
		}
	}
	b.WriteString("\n    def _to_c(self, c: Any, parent: Any, path: str, keep: list[Any]) -> None:\n")
	fmt.Fprintf(b, "        \"\"\"Writes the %s into c, a %s, and its fields the parent struct carries into parent.\"\"\"\n", v.Name, d.CName)
	fmt.Fprintf(b, "        c.%s = %s\n", v.KindC, v.PropValue)
	for _, f := range v.Fields {
		val, where := "self."+f.Name, fmt.Sprintf("_path(path, '%s')", f.Name)
		if f.Default == "None" {
			val = fmt.Sprintf("0 if %s is None else %s", val, val)
		}
		switch {
		case f.Field == nil && f.Kind == "bool":
			fmt.Fprintf(b, "        if %s:\n            parent.%s = True\n", val, f.Into)
		case f.Field == nil:
			fmt.Fprintf(b, "        set_field(parent, %q, %s, %s)\n", f.Into, val, where)
		case f.Kind == "bool":
			fmt.Fprintf(b, "        c.%s = bool(%s)\n", f.Field.CName, val)
		case f.Kind == "float":
			fmt.Fprintf(b, "        c.%s = float(%s)\n", f.Field.CName, val)
		case f.Kind == "str":
			fmt.Fprintf(b, "        c.%s = _cstr(%s, %s, keep)\n", f.Field.CName, val, where)
		case f.Kind == "path":
			fmt.Fprintf(b, "        c.%s = _cpath(%s, %s, keep)\n", f.Field.CName, val, where)
		default:
			fmt.Fprintf(b, "        set_field(c, %q, %s, %s)\n", f.Field.CName, val, where)
		}
	}
}

// pyVariantClasses resolves every //kvcm:pyvariant of the model.
func pyVariantClasses(m *Model) (map[*Decl][]*pyVariantClass, []*Decl, error) {
	out := map[*Decl][]*pyVariantClass{}
	var decls []*Decl
	for _, d := range m.Decls {
		for _, v := range d.PyVariants {
			c, err := resolvePyVariant(m, d, v)
			if err != nil {
				return nil, nil, err
			}
			if len(out[d]) == 0 {
				decls = append(decls, d)
			}
			out[d] = append(out[d], c)
		}
	}
	return out, decls, nil
}
