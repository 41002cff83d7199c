package gen

import (
	"fmt"
	"slices"
	"strings"
)

// A //kvcm:cppvalue struct's //kvcm:cppvariant <Name> <enum field>=<member>
// args=<field>:<param>[=default],... line gets, after the value type, a
// struct Name deriving from it whose constructor fixes the enum field (its
// C++ name) to the member (its C++ name) and sets each field named in args=
// (C++ names) from a parameter of the field's type, in that order, with
// its default; every other field takes its default. The constructor
// is explicit when one argument can call it. The tiers:
// GpuCacheTierConfig(quotaBytes, maxQuotaBytes = 0) is a CacheTierConfig of
// kind kGpu.
func cppVariant(b *strings.Builder, d *Decl, fields []*cppValueField, line string) error {
	where := fmt.Sprintf("%s (//kvcm:cppvariant %q)", d.GoName, line)
	args := strings.Fields(line)
	if len(args) != 3 {
		return fmt.Errorf("%s: want \"<Name> <enum field>=<member> args=<field>:<param>[=default],...\"", where)
	}
	name := args[0]
	kind, member, ok := strings.Cut(args[1], "=")
	list, ok2 := strings.CutPrefix(args[2], "args=")
	if !ok || !ok2 {
		return fmt.Errorf("%s: want \"<Name> <enum field>=<member> args=<field>:<param>[=default],...\"", where)
	}
	ki := slices.IndexFunc(fields, func(f *cppValueField) bool { return f.Name == kind })
	if ki < 0 || fields[ki].Field == nil || fields[ki].Field.Type.Kind != KNamed || fields[ki].Field.Type.Decl.Kind != DEnum {
		return fmt.Errorf("%s: %s is not an enum field of %s", where, kind, d.CppValue.Name)
	}
	enum := fields[ki].Field.Type.Decl
	if !slices.ContainsFunc(enum.Members, func(e *EnumMember) bool { return e.CppName == member }) {
		return fmt.Errorf("%s: %s is not a member of %s", where, member, enum.CppName)
	}
	init := map[string]string{kind: enum.CppName + "::" + member}
	required := 0
	var params []string
	for _, a := range strings.Split(list, ",") {
		field, param, _ := strings.Cut(a, ":")
		param, def, _ := strings.Cut(param, "=")
		i := slices.IndexFunc(fields, func(f *cppValueField) bool { return f.Name == field })
		if i < 0 || i == ki || param == "" {
			return fmt.Errorf("%s: args= names %q, not a field of %s with a parameter", where, a, d.CppValue.Name)
		}
		t := fields[i].Type
		value := param
		if strings.HasPrefix(t, "std::") && !strings.HasPrefix(t, "std::int") && !strings.HasPrefix(t, "std::uint") {
			value = "std::move(" + param + ")"
		}
		init[field] = value
		if def != "" {
			params = append(params, t+" "+param+" = "+def)
		} else {
			if required < len(params) {
				return fmt.Errorf("%s: %s has no default after a parameter with one", where, param)
			}
			params = append(params, t+" "+param)
			required++
		}
	}
	var agg []string
	for _, f := range fields {
		switch v, ok := init[f.Name]; {
		case ok:
			agg = append(agg, v)
		case f.Default != "":
			agg = append(agg, f.Default)
		default:
			agg = append(agg, "{}")
		}
	}
	explicit := ""
	if required <= 1 {
		explicit = "explicit "
	}
	cppComment(b, "", fmt.Sprintf("%s is a %s of %s %s (//kvcm:cppvariant).", name, d.CppValue.Name, kind, member))
	fmt.Fprintf(b, "struct %s : %s\n{\n", name, d.CppValue.Name)
	fmt.Fprintf(b, "    %s%s(%s)\n        : %s{%s}\n    {\n    }\n};\n\n", explicit, name, strings.Join(params, ", "), d.CppValue.Name, strings.Join(agg, ", "))
	return nil
}
