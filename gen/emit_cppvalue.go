package gen

import (
	"fmt"
	"slices"
	"strings"
)

func init() { emitters = append(emitters, emitCppValues) }

// A struct with //kvcm:cppvalue <Name> [order=a,b,...] gets, in the C++
// value header (Paths.CppValues, included by the hand-written kvcm.hpp), an
// owning value type kvcm::<Name> and detail::C<Name>, which converts one to
// the C struct for one call (its pointers borrow from the value and from the
// converter). The value's fields follow the C struct's by type:
//
//   - a scalar, enum (as its enum class) or typedef: itself;
//   - a const char*: std::string (an empty one is NULL where the field is
//     nullable); a NUL byte in it is KVCM_ERR_INVALID_CONFIG naming the
//     field's path, since the C string would end there (with arg:
//     KVCM_ERR_INVALID_ARGUMENT, for a value passed to a function); one
//     with a length (len=) is bytes and may hold NUL bytes;
//   - a const T* with a count: std::vector of T, or of T's value type (T's
//     C struct where T has none);
//   - a nullable const T* without one: std::optional of T's value type.
//
// Counts, struct_size and abi_version are set by the converter; a field
// tagged cpp:"-" is not in the value type, and //kvcm:cppfield name type
// [default] | doc adds a field the C struct lacks: the hand-written binding
// converts both. cpp:"name" renames a field (default: lowerCamel of its C
// name), cppdefault:"v" gives its default (default: zero, an enum's zero
// member), path:"name" the name errors give it (default: its C name).
// //kvcm:cppdoc lines replace the struct's doc, //kvcm:cppmethod lines are
// member functions, verbatim.

// cppValueField is one field of a C++ value type: from the C struct
// (Field) or the binding's own.
type cppValueField struct {
	Name, Type, Default, Doc string
	Field                    *Field
}

// parseValueType reads a //kvcm:<kind> <Name> [order=a,b,...] directive
// with its //kvcm:<prefix>doc and //kvcm:<prefix>field lines.
func parseValueType(d directives, kind, prefix string) (*ValueType, error) {
	args := strings.Fields(d.one(kind))
	if len(args) == 0 {
		return nil, fmt.Errorf("no name")
	}
	v := &ValueType{Name: args[0], Methods: d[prefix+"method"], Variants: d[prefix+"variant"]}
	for _, a := range args[1:] {
		if a == "out" {
			v.Out = true
			continue
		}
		if a == "arg" {
			v.Arg = true
			continue
		}
		order, ok := strings.CutPrefix(a, "order=")
		if !ok {
			return nil, fmt.Errorf("unknown argument %q", a)
		}
		v.Order = strings.Split(order, ",")
	}
	v.Doc = strings.Join(d[prefix+"doc"], "\n")
	for _, line := range d[prefix+"field"] {
		decl, doc, _ := strings.Cut(line, " | ")
		f := strings.Fields(decl)
		if len(f) < 2 {
			return nil, fmt.Errorf("//kvcm:%sfield %q: want \"name type [default] | doc\"", prefix, line)
		}
		v.Own = append(v.Own, &OwnField{Name: f[0], Type: f[1], Default: strings.Join(f[2:], " "), Doc: strings.TrimSpace(doc)})
	}
	return v, nil
}

// counts returns the C names of the count fields of d's arrays.
func counts(d *Decl) map[string]bool {
	out := map[string]bool{}
	for _, f := range d.Fields {
		if f.Len != "" {
			out[f.Len] = true
		}
	}
	return out
}

// cppValueFields lists the fields of d's C++ value type, in its order.
func cppValueFields(d *Decl) ([]*cppValueField, error) {
	cnt := counts(d)
	var out []*cppValueField
	for _, f := range d.Fields {
		if f.Cpp == "-" || cnt[f.CName] || (d.Versioned && (f.CName == "struct_size" || f.CName == "abi_version")) {
			continue
		}
		t, def, err := cppValueType(f)
		if err != nil {
			return nil, fmt.Errorf("%s.%s (//kvcm:cppvalue): %w", d.GoName, f.GoName, err)
		}
		if f.CppDefault != "" {
			def = f.CppDefault
			if f.Type.Kind == KNamed && f.Type.Decl.Kind == DEnum {
				def = f.Type.Decl.CppName + "::" + def
			}
		}
		name := lowerCamel(f.CName)
		if f.Cpp != "" {
			name = f.Cpp
		}
		out = append(out, &cppValueField{Name: name, Type: t, Default: def, Doc: renamed(f.Doc, f.CName, name), Field: f})
	}
	for _, o := range d.CppValue.Own {
		out = append(out, &cppValueField{Name: o.Name, Type: o.Type, Default: o.Default, Doc: o.Doc})
	}
	if len(d.CppValue.Order) == 0 {
		return out, nil
	}
	if len(d.CppValue.Order) != len(out) {
		return nil, fmt.Errorf("%s: //kvcm:cppvalue order= names %d fields, the value type has %d", d.GoName, len(d.CppValue.Order), len(out))
	}
	ordered := make([]*cppValueField, 0, len(out))
	for _, name := range d.CppValue.Order {
		i := slices.IndexFunc(out, func(f *cppValueField) bool { return f.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%s: //kvcm:cppvalue order= names %q, not a field of the value type", d.GoName, name)
		}
		ordered = append(ordered, out[i])
	}
	return ordered, nil
}

// cppValueType is the C++ type of a field in a value type and its default
// initializer.
func cppValueType(f *Field) (typ, def string, err error) {
	t := f.Type
	switch {
	case t.Kind == KScalar && t.Scalar == "bool":
		return "bool", "false", nil
	case t.Kind == KScalar || t.Kind == KSize:
		return cppScalar(t), "0", nil
	case t.Kind == KNamed && t.Decl.Kind == DEnum:
		for _, m := range t.Decl.Members {
			if m.Value == 0 {
				return t.Decl.CppName, t.Decl.CppName + "::" + m.CppName, nil
			}
		}
		return t.Decl.CppName, "", fmt.Errorf("enum %s has no zero member: give a cppdefault", t.Decl.GoName)
	case t.Kind == KNamed && t.Decl.Kind == DTypedef:
		return t.Decl.CppName, "0", nil
	case t.Kind == KCStr:
		return "std::string", "", nil
	case t.Kind == KPtr && t.Dir == DirIn && f.Len != "":
		e, err := cppValueElem(t.Elem)
		return "std::vector<" + e + ">", "", err
	case t.Kind == KPtr && t.Dir == DirIn && f.Nullable:
		if t.Elem.Kind != KNamed || t.Elem.Decl.CppValue == nil {
			return "", "", fmt.Errorf("a single const T* needs T with //kvcm:cppvalue")
		}
		return "std::optional<" + t.Elem.Decl.CppValue.Name + ">", "", nil
	}
	return "", "", fmt.Errorf("no C++ value type for %s: tag it cpp:\"-\" and convert it by hand", t.CName())
}

func cppValueElem(t *Type) (string, error) {
	switch {
	case t.Kind == KScalar || t.Kind == KSize:
		return cppScalar(t), nil
	case t.Kind == KNamed && (t.Decl.Kind == DTypedef || t.Decl.Kind == DEnum):
		return t.Decl.CppName, nil
	case t.Kind == KNamed && t.Decl.CppValue != nil:
		return t.Decl.CppValue.Name, nil
	case t.Kind == KNamed && t.Decl.Kind == DStruct && t.Decl.CppNamespace == "":
		return t.Decl.CppName, nil
	case t.Kind == KNamed && t.Decl.Kind == DStruct:
		return t.Decl.CppNamespace + "::" + t.Decl.CppName, nil
	}
	return "", fmt.Errorf("no C++ value type for elements %s (give the struct //kvcm:cppvalue)", t.CName())
}

// cppValueDecls lists the //kvcm:cppvalue structs, each after the value
// types of its fields.
func cppValueDecls(m *Model) []*Decl {
	var out []*Decl
	seen := map[*Decl]bool{}
	var visit func(d *Decl)
	visit = func(d *Decl) {
		if seen[d] {
			return
		}
		seen[d] = true
		for _, f := range d.Fields {
			if t := f.Type; t.Kind == KPtr && t.Elem.Kind == KNamed && t.Elem.Decl.CppValue != nil {
				visit(t.Elem.Decl)
			}
		}
		out = append(out, d)
	}
	for _, d := range m.Decls {
		if d.CppValue != nil {
			visit(d)
		}
	}
	return out
}

func emitCppValues(m *Model, p Paths) (map[string][]byte, error) {
	decls := cppValueDecls(m)
	if p.CppValues == "" || len(decls) == 0 {
		return nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "// %s\n", Banner)
	cppComment(&b, "", `kvcm_values_generated.hpp: the C++ value types of kvcm's configuration
structs (//kvcm:cppvalue in gen/abi) and their conversion to the C structs,
detail::C<Name>: its pointers borrow from the value and from the converter,
for one call. Included by kvcm.hpp, after kvcm::Error; not on its own.`)
	guard := strings.ToUpper(m.Prefix) + "_" + strings.ToUpper(m.Prefix) + "_VALUES_GENERATED_HPP"
	fmt.Fprintf(&b, "#ifndef %s\n#define %s\n\n", guard, guard)
	b.WriteString("#include <cstddef>\n#include <cstdint>\n#include <memory>\n#include <optional>\n#include <string>\n#include <utility>\n#include <vector>\n\n")
	fmt.Fprintf(&b, "namespace %s {\n\nnamespace detail {\n\n", m.Prefix)
	b.WriteString(`// configError is the kvcm::Error the library raises for a bad field.
inline Error configError(std::string const& field, std::string const& msg)
{
    return Error(StatusCode::kInvalidConfig, "invalid config: " + field + ": " + msg);
}

// checkCString rejects a string the C ABI would cut at a NUL byte: a bad
// field of a configuration, or with kInvalidArgument of an argument.
inline void checkCString(std::string const& field, std::string const& s, StatusCode code = StatusCode::kInvalidConfig)
{
    if (auto const at = s.find('\0'); at != std::string::npos)
    {
        std::string const msg = "contains a NUL byte at offset " + std::to_string(at);
        throw code == StatusCode::kInvalidConfig ? configError(field, msg) : Error(code, field + ": " + msg);
    }
}

// fieldPath is the path errors give a field of the value at path.
inline std::string fieldPath(std::string const& path, char const* name)
{
    return path.empty() ? std::string(name) : path + "." + name;
}

inline std::string fieldPath(std::string const& path, char const* name, std::size_t i)
{
    return fieldPath(path, name) + "[" + std::to_string(i) + "]";
}

} // namespace detail

`)
	for _, d := range decls {
		if d.CppNamespace == "" && d.CppName == d.CppValue.Name {
			return nil, fmt.Errorf("%s: //kvcm:cppvalue %s is the name of the C struct's alias: give the struct a //kvcm:cppns", d.GoName, d.CppValue.Name)
		}
		if err := cppValueStruct(&b, d); err != nil {
			return nil, err
		}
	}
	b.WriteString("namespace detail {\n\n")
	for _, d := range decls {
		convert := cppValueConverter
		if d.CppValue.Out {
			convert = cppValueFromC
		}
		if err := convert(&b, m, d); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(&b, "} // namespace detail\n\n} // namespace %s\n\n#endif // %s\n", m.Prefix, guard)
	return map[string][]byte{p.CppValues: []byte(b.String())}, nil
}

func cppValueStruct(b *strings.Builder, d *Decl) error {
	fields, err := cppValueFields(d)
	if err != nil {
		return err
	}
	doc := d.CppValue.Doc
	if doc == "" {
		doc = d.Doc
	}
	cppComment(b, "", doc)
	fmt.Fprintf(b, "struct %s\n{\n", d.CppValue.Name)
	for _, f := range fields {
		if f.Doc != "" {
			cppComment(b, "    ", f.Doc)
		}
		if f.Default != "" {
			fmt.Fprintf(b, "    %s %s = %s;\n", f.Type, f.Name, f.Default)
		} else {
			fmt.Fprintf(b, "    %s %s;\n", f.Type, f.Name)
		}
	}
	for _, m := range d.CppValue.Methods {
		fmt.Fprintf(b, "\n    %s\n", m)
	}
	b.WriteString("};\n\n")
	for _, line := range d.CppValue.Variants {
		if err := cppVariant(b, d, fields, line); err != nil {
			return err
		}
	}
	return nil
}

// cppValueConverter writes detail::C<Name>: its constructor converts every
// field the value type shares with the C struct, get() is the C struct
// (mutable for the hand-written fields).
func cppValueConverter(b *strings.Builder, m *Model, d *Decl) error {
	fields, err := cppValueFields(d)
	if err != nil {
		return err
	}
	name := "C" + d.CppValue.Name
	fmt.Fprintf(b, "// %s is the C form of %s (%s).\n", name, d.CppValue.Name, d.CName)
	fmt.Fprintf(b, "class %s\n{\npublic:\n", name)
	fmt.Fprintf(b, "    %s(%s const& v, [[maybe_unused]] std::string const& path)\n    {\n", name, d.CppValue.Name)
	if d.Versioned {
		fmt.Fprintf(b, "        mC.struct_size = static_cast<std::uint32_t>(sizeof(::%s));\n", d.CName)
		fmt.Fprintf(b, "        mC.abi_version = %s_ABI_VERSION;\n", strings.ToUpper(m.Prefix))
	}
	var members []string
	byC := map[string]*cppValueField{}
	for _, f := range fields {
		if f.Field != nil {
			byC[f.Field.CName] = f
		}
	}
	for _, cf := range d.Fields {
		f := byC[cf.CName]
		if f == nil {
			continue
		}
		c, v := "mC."+cf.CName, "v."+f.Name
		pathName := cf.CName
		if cf.Path != "" {
			pathName = cf.Path
		}
		t := cf.Type
		switch {
		case t.Kind == KNamed && t.Decl.Kind == DEnum:
			fmt.Fprintf(b, "        %s = static_cast<::%s>(%s);\n", c, t.Decl.CName, v)
		case t.Kind == KCStr && cf.Len != "":
			fmt.Fprintf(b, "        %s = %s.empty() ? nullptr : %s.data();\n        mC.%s = %s.size();\n", c, v, v, cf.Len, v)
		case t.Kind == KCStr:
			code := ""
			if d.CppValue.Arg {
				code = ", StatusCode::kInvalidArgument"
			}
			fmt.Fprintf(b, "        checkCString(fieldPath(path, \"%s\"), %s%s);\n", pathName, v, code)
			if cf.Nullable {
				fmt.Fprintf(b, "        %s = %s.empty() ? nullptr : %s.c_str();\n", c, v, v)
			} else {
				fmt.Fprintf(b, "        %s = %s.c_str();\n", c, v)
			}
		case t.Kind == KPtr && cf.Len != "" && t.Elem.Kind == KNamed && t.Elem.Decl.CppValue != nil:
			conv, m := "C"+t.Elem.Decl.CppValue.Name, "m"+Camel(cf.CName)
			members = append(members, fmt.Sprintf("std::vector<%s> %s;", conv, m), fmt.Sprintf("std::vector<::%s> %sC;", t.Elem.Decl.CName, m))
			fmt.Fprintf(b, "        %s.reserve(%s.size());\n        %sC.reserve(%s.size());\n", m, v, m, v)
			fmt.Fprintf(b, "        for (std::size_t i = 0; i < %s.size(); ++i)\n        {\n", v)
			fmt.Fprintf(b, "            %s.emplace_back(%s[i], fieldPath(path, \"%s\", i));\n", m, v, pathName)
			fmt.Fprintf(b, "            %sC.push_back(%s.back().get());\n        }\n", m, m)
			fmt.Fprintf(b, "        %s = %sC.empty() ? nullptr : %sC.data();\n        mC.%s = %sC.size();\n", c, m, m, cf.Len, m)
		case t.Kind == KPtr && cf.Len != "":
			fmt.Fprintf(b, "        %s = %s.empty() ? nullptr : %s.data();\n        mC.%s = %s.size();\n", c, v, v, cf.Len, v)
		case t.Kind == KPtr:
			conv, m := "C"+t.Elem.Decl.CppValue.Name, "m"+Camel(cf.CName)
			members = append(members, fmt.Sprintf("std::unique_ptr<%s> %s;", conv, m))
			fmt.Fprintf(b, "        if (%s)\n        {\n", v)
			fmt.Fprintf(b, "            %s = std::make_unique<%s>(*%s, fieldPath(path, \"%s\"));\n", m, conv, v, pathName)
			fmt.Fprintf(b, "            %s = &%s->get();\n        }\n", c, m)
		default:
			fmt.Fprintf(b, "        %s = %s;\n", c, v)
		}
	}
	b.WriteString("    }\n\n")
	fmt.Fprintf(b, "    [[nodiscard]] ::%s const& get() const noexcept { return mC; }\n", d.CName)
	fmt.Fprintf(b, "    [[nodiscard]] ::%s& get() noexcept { return mC; }\n\n", d.CName)
	b.WriteString("private:\n")
	fmt.Fprintf(b, "    ::%s mC{};\n", d.CName)
	for _, s := range members {
		fmt.Fprintf(b, "    %s\n", s)
	}
	b.WriteString("};\n\n")
	return nil
}

// cppValueFromC writes detail::fromC, which copies a C struct the library
// returned into its value type (//kvcm:cppvalue <Name> out).
func cppValueFromC(b *strings.Builder, _ *Model, d *Decl) error {
	fields, err := cppValueFields(d)
	if err != nil {
		return err
	}
	fmt.Fprintf(b, "// fromC copies a %s into a %s (its own fields left at their defaults).\n", d.CName, d.CppValue.Name)
	fmt.Fprintf(b, "inline %s fromC(::%s const& c)\n{\n    %s v;\n", d.CppValue.Name, d.CName, d.CppValue.Name)
	for _, f := range fields {
		cf := f.Field
		if cf == nil {
			continue
		}
		c, v, t := "c."+cf.CName, "v."+f.Name, cf.Type
		switch {
		case t.Kind == KNamed && t.Decl.Kind == DEnum:
			fmt.Fprintf(b, "    %s = static_cast<%s>(%s);\n", v, t.Decl.CppName, c)
		case t.Kind == KCStr && cf.Len != "":
			fmt.Fprintf(b, "    if (%s != nullptr && c.%s > 0)\n    {\n        %s.assign(%s, c.%s);\n    }\n", c, cf.Len, v, c, cf.Len)
		case t.Kind == KCStr:
			fmt.Fprintf(b, "    %s = %s != nullptr ? std::string(%s) : std::string();\n", v, c, c)
		case t.Kind == KPtr && cf.Len != "" && (t.Elem.Kind != KNamed || t.Elem.Decl.CppValue == nil):
			fmt.Fprintf(b, "    if (%s != nullptr && c.%s > 0)\n    {\n        %s.assign(%s, %s + c.%s);\n    }\n", c, cf.Len, v, c, c, cf.Len)
		case t.Kind == KPtr:
			return fmt.Errorf("%s.%s: an out value type copies arrays of scalars only: tag it cpp:\"-\"", d.GoName, cf.GoName)
		default:
			fmt.Fprintf(b, "    %s = %s;\n", v, c)
		}
	}
	b.WriteString("    return v;\n}\n\n")
	return nil
}
