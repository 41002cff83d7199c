package gen

import (
	"fmt"
	"slices"
	"strings"
)

func init() { emitters = append(emitters, emitCpp) }

func emitCpp(m *Model, p Paths) (map[string][]byte, error) {
	return map[string][]byte{p.Cpp: []byte(EmitCpp(m, p))}, nil
}

func cppComment(b *strings.Builder, indent, text string) {
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			b.WriteString(indent + "//\n")
		} else {
			b.WriteString(indent + "// " + line + "\n")
		}
	}
}

// cppScalar maps a C scalar to its std:: spelling.
func cppScalar(t *Type) string {
	switch t.Kind {
	case KScalar:
		switch t.Scalar {
		case "bool", "double", "float":
			return t.Scalar
		}
		return "std::" + t.Scalar
	case KSize:
		return "std::size_t"
	}
	return t.CName()
}

// EmitCpp writes the C++ declarations the hand-written C++ header builds on:
// constants, aliases of the C types in namespace kvcm, enum classes with the
// C values, makeX() initializers of versioned structs, name() of every enum,
// and compile-time layout checks.
func EmitCpp(m *Model, p Paths) string {
	var b strings.Builder
	fmt.Fprintf(&b, "// %s\n", Banner)
	cppComment(&b, "", `kvcm_generated.hpp: the C++ declarations of kvcm's C ABI, generated from the
ABI description (gen/abi) together with kvcm.h. The hand-written kvcm.hpp
includes this file and adds the RAII classes and the codec interface.
Requires C++17.`)
	guard := strings.ToUpper(m.Prefix) + "_" + strings.ToUpper(m.Prefix) + "_GENERATED_HPP"
	fmt.Fprintf(&b, "#ifndef %s\n#define %s\n\n", guard, guard)
	if slices.ContainsFunc(m.Decls, func(d *Decl) bool { return d.CppImpl }) {
		b.WriteString("#include <algorithm>\n")
	}
	b.WriteString("#include <cstddef>\n#include <cstdint>\n")
	if slices.ContainsFunc(m.Decls, func(d *Decl) bool { return d.CppImpl }) {
		b.WriteString("#include <string_view>\n")
	}
	b.WriteString("#include <type_traits>\n\n")
	fmt.Fprintf(&b, "#include \"%s\"\n\n", p.Include)
	fmt.Fprintf(&b, "namespace %s {\n\n", m.Prefix)

	b.WriteString("// ---- Constants ----\n\n")
	for _, c := range m.Consts {
		cppComment(&b, "", c.Doc)
		name := "k" + Camel(Snake(c.GoName))
		if c.Str {
			fmt.Fprintf(&b, "inline constexpr const char* %s = %s;\n\n", name, c.CName)
		} else {
			fmt.Fprintf(&b, "inline constexpr %s %s = %s;\n\n", cppScalar(c.Type), name, c.CName)
		}
	}

	b.WriteString("// ---- Scalar types and handles ----\n\n")
	for _, d := range m.Decls {
		if d.Kind == DTypedef || d.Kind == DHandle {
			cppComment(&b, "", d.Doc)
			fmt.Fprintf(&b, "using %s = ::%s;\n", d.CppName, d.CName)
			for _, a := range d.CppAliases {
				fmt.Fprintf(&b, "using %s = %s;\n", a, d.CppName)
			}
			b.WriteString("\n")
		}
	}

	b.WriteString("// ---- Enumerations ----\n\n")
	for _, d := range m.Decls {
		if d.Kind != DEnum {
			continue
		}
		base := cppScalar(d.Base)
		if d.CppBase != "" {
			base = d.CppBase
		}
		cppComment(&b, "", d.Doc)
		fmt.Fprintf(&b, "enum class %s : %s {\n", d.CppName, base)
		for _, e := range d.Members {
			cppComment(&b, "    ", e.Doc)
			fmt.Fprintf(&b, "    %s = %s,\n", e.CppName, e.CName)
		}
		b.WriteString("};\n")
		fmt.Fprintf(&b, "static_assert(sizeof(%s) == sizeof(::%s), \"%s has the C size\");\n\n", d.CppName, d.CName, d.CppName)
		fmt.Fprintf(&b, "// name returns the C name of a %s value (\"\" for an unknown value).\n", d.CppName)
		fmt.Fprintf(&b, "constexpr const char* name(%s v) noexcept {\n    switch (v) {\n", d.CppName)
		for _, e := range d.Members {
			fmt.Fprintf(&b, "    case %s::%s:\n        return \"%s\";\n", d.CppName, e.CppName, e.CName)
		}
		b.WriteString("    }\n    return \"\";\n}\n\n")
	}

	b.WriteString("// ---- Callbacks and opaque types ----\n\n")
	for _, d := range m.Decls {
		if d.Kind == DCallback || d.Kind == DOpaque {
			cppComment(&b, "", d.Doc)
			fmt.Fprintf(&b, "using %s = ::%s;\n\n", d.CppName, d.CName)
		}
	}

	b.WriteString("// ---- Structures (the C structs themselves; layouts checked below) ----\n\n")
	var nested []string
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		if d.CppNamespace != "" {
			if !slices.Contains(nested, d.CppNamespace) {
				nested = append(nested, d.CppNamespace)
			}
			continue
		}
		cppStruct(&b, m, d)
	}
	slices.Sort(nested)
	for _, ns := range nested {
		fmt.Fprintf(&b, "// ---- Structures that borrow pointers for one call: %s::%s ----\n\n", m.Prefix, ns)
		fmt.Fprintf(&b, "namespace %s {\n\n", ns)
		for _, d := range m.Decls {
			if d.Kind == DStruct && d.CppNamespace == ns {
				cppStruct(&b, m, d)
			}
		}
		fmt.Fprintf(&b, "}  // namespace %s\n\n", ns)
	}
	var impls []*Decl
	for _, d := range m.Decls {
		if d.CppImpl {
			impls = append(impls, d)
		}
	}
	if len(impls) > 0 {
		b.WriteString("// ---- Vtable trampolines for C++ implementations ----\n\nnamespace detail {\n\n")
		for _, d := range impls {
			cppTrampolines(&b, d)
		}
		b.WriteString("}  // namespace detail\n\n")
	}
	fmt.Fprintf(&b, "}  // namespace %s\n\n#endif  // %s\n", m.Prefix, guard)
	return b.String()
}

func cppStruct(b *strings.Builder, m *Model, d *Decl) {
	cppComment(b, "", d.Doc)
	fmt.Fprintf(b, "using %s = ::%s;\n", d.CppName, d.CName)
	fmt.Fprintf(b, "static_assert(std::is_standard_layout_v<%s> && std::is_trivially_copyable_v<%s>);\n", d.CppName, d.CppName)
	fmt.Fprintf(b, "static_assert(sizeof(%s) == %d && alignof(%s) == %d);\n", d.CppName, d.size, d.CppName, d.align)
	if d.Versioned {
		fmt.Fprintf(b, "\n// make%s returns a zeroed %s with struct_size and abi_version set.\n", d.CppName, d.CppName)
		fmt.Fprintf(b, "inline %s make%s() noexcept {\n    %s v{};\n    v.struct_size = static_cast<std::uint32_t>(sizeof(%s));\n    v.abi_version = %s_ABI_VERSION;\n    return v;\n}\n",
			d.CppName, d.CppName, d.CppName, d.CppName, strings.ToUpper(m.Prefix))
	}
	b.WriteString("\n")
}
