package gen

import (
	"fmt"
	"strings"
)

// paramTags describes a parameter's direction and ownership, such as
// "in, consumed, nullable" or "out, array of capacity".
func paramTags(p *Param) string {
	var tags []string
	switch {
	case p.Has("consumed"):
		tags = append(tags, "in", "consumed")
	case p.Type.Kind == KPtr && p.Type.Dir == DirOut:
		tags = append(tags, "out")
	case p.Type.Kind == KPtr && p.Type.Dir == DirInOut:
		tags = append(tags, "in/out")
	default:
		tags = append(tags, "in")
		if p.Type.IsPointer() && !(p.Type.Kind == KNamed && p.Type.Decl.Kind == DCallback) {
			tags = append(tags, "borrowed")
		}
	}
	if p.Has("owned") {
		tags = append(tags, "owned")
	}
	if p.Nullable {
		tags = append(tags, "nullable")
	}
	if p.Len != "" {
		tags = append(tags, "array of "+p.Len)
	}
	return strings.Join(tags, ", ")
}

func fieldTags(f *Field) string {
	var tags []string
	if f.Own != "" {
		tags = append(tags, f.Own)
	}
	if f.Nullable {
		tags = append(tags, "nullable")
	}
	if f.Len != "" {
		tags = append(tags, "array of "+f.Len)
	}
	if len(tags) == 0 {
		return ""
	}
	return "[" + strings.Join(tags, ", ") + "] "
}

// cComment renders text as a C block comment with the given indent.
func cComment(b *strings.Builder, indent, text string) {
	b.WriteString(indent + "/**\n")
	for _, line := range strings.Split(text, "\n") {
		if line == "" {
			b.WriteString(indent + " *\n")
		} else {
			b.WriteString(indent + " * " + line + "\n")
		}
	}
	b.WriteString(indent + " */\n")
}

func constValueC(c *Const) string {
	if c.Str {
		return fmt.Sprintf("%q", c.Value)
	}
	switch c.Type.Kind {
	case KScalar:
		switch c.Type.Scalar {
		case "uint32_t", "uint16_t", "uint8_t":
			return c.Value + "u"
		case "uint64_t":
			return c.Value + "ull"
		case "int64_t":
			return c.Value + "ll"
		}
	}
	if strings.HasPrefix(c.Value, "-") {
		return "(" + c.Value + ")"
	}
	return c.Value
}

func (m *Model) guard() string {
	return strings.ToUpper(m.Prefix) + "_" + strings.ToUpper(m.Prefix) + "_H"
}

// funcDoc is the documentation block of a function, shared by the C header
// and the API reference.
func funcDoc(f *Func, c bool) string {
	var b strings.Builder
	b.WriteString(f.Doc)
	b.WriteString("\n\n")
	for _, p := range f.Sig.Params {
		if c {
			fmt.Fprintf(&b, "@param %s [%s] %s\n", p.CName, paramTags(p), p.Doc)
		}
	}
	if c {
		switch {
		case f.Sig.Result.IsStatus():
			b.WriteString("@return NULL on success; otherwise a status to free with kvcm_status_free.\n")
		case f.Returns != "":
			b.WriteString("@return " + f.Returns + "\n")
		}
		b.WriteString("@par Thread safety\n" + threadDocs[f.Thread] + "\n")
		fmt.Fprintf(&b, "@since ABI version %d.", f.Since)
	}
	return strings.TrimRight(b.String(), "\n")
}

// EmitCHeader writes the public C header.
func EmitCHeader(m *Model) string {
	var b strings.Builder
	P := strings.ToUpper(m.Prefix)
	fmt.Fprintf(&b, "/* %s */\n", Banner)
	cComment(&b, "", strings.ReplaceAll(`kvcm.h: the C ABI of kvcm, a paged KV-cache manager.

Conventions:
- Functions that can fail return kvcm_status*: NULL is success; otherwise
  the status holds a code and a copied message and must be freed with
  kvcm_status_free.
- Versioned structs and vtables start with uint32_t struct_size and
  uint32_t abi_version; set them to sizeof(the struct) and KVCM_ABI_VERSION.
  Fields are only ever appended.
- Handles are nonzero integers; a freed or consumed handle is reported as
  KVCM_ERR_INVALID_HANDLE, never dereferenced.
- [in, borrowed] pointers are read during the call only; [in, consumed]
  objects belong to the library from the call on, on success and on failure;
  [out] pointers are written by the library.
- Queries fill caller buffers and report the element count needed; NULL
  buffers with capacity 0 ask for the count.
- A panic inside the library returns KVCM_ERR_INTERNAL and poisons it: every
  later call fails with KVCM_ERR_POISONED.
- 64-bit platforms only; the layouts below are frozen by static asserts.`, "kvcm", m.Prefix))
	g := m.guard()
	fmt.Fprintf(&b, "#ifndef %s\n#define %s\n\n", g, g)
	b.WriteString("#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n\n")
	b.WriteString("#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n")
	fmt.Fprintf(&b, `#if defined(_WIN32)
#define %[1]s_API
#elif defined(__GNUC__)
#define %[1]s_API __attribute__((visibility("default")))
#else
#define %[1]s_API
#endif

#if defined(__GNUC__)
#define %[1]s_WARN_UNUSED __attribute__((warn_unused_result))
#else
#define %[1]s_WARN_UNUSED
#endif

#if defined(__cplusplus)
#define %[1]s_ALIGNAS(n) alignas(n)
#define %[1]s_ALIGNOF(t) alignof(t)
#define %[1]s_STATIC_ASSERT(c, msg) static_assert(c, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define %[1]s_ALIGNAS(n) _Alignas(n)
#define %[1]s_ALIGNOF(t) _Alignof(t)
#define %[1]s_STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#elif defined(__GNUC__)
#define %[1]s_ALIGNAS(n) __attribute__((aligned(n)))
#elif defined(_MSC_VER)
#define %[1]s_ALIGNAS(n) __declspec(align(n))
#else
#define %[1]s_ALIGNAS(n)
#endif

`, P)

	b.WriteString("/* ---- Constants ---- */\n\n")
	for _, c := range m.Consts {
		cComment(&b, "", c.Doc+fmt.Sprintf("\n@since ABI version %d.", c.Since))
		fmt.Fprintf(&b, "#define %s %s\n\n", c.CName, constValueC(c))
	}

	b.WriteString("/* ---- Scalar types and handles ---- */\n\n")
	for _, d := range m.Decls {
		if d.Kind == DTypedef || d.Kind == DHandle {
			cComment(&b, "", d.Doc+fmt.Sprintf("\n@since ABI version %d.", d.Since))
			fmt.Fprintf(&b, "typedef %s %s;\n\n", d.Base.CName(), d.CName)
		}
	}

	b.WriteString("/* ---- Enumerations (fixed-width: the typedef is the type, the enum holds the values) ---- */\n\n")
	for _, d := range m.Decls {
		if d.Kind != DEnum {
			continue
		}
		cComment(&b, "", d.Doc+fmt.Sprintf("\n@since ABI version %d.", d.Since))
		fmt.Fprintf(&b, "typedef %s %s;\n", d.Base.CName(), d.CName)
		b.WriteString("enum {\n")
		for _, e := range d.Members {
			cComment(&b, "    ", e.Doc)
			fmt.Fprintf(&b, "    %s = %d,\n", e.CName, e.Value)
		}
		b.WriteString("};\n\n")
	}

	b.WriteString("/* ---- Opaque types ---- */\n\n")
	for _, d := range m.Decls {
		if d.Kind == DOpaque {
			cComment(&b, "", d.Doc+fmt.Sprintf("\n@since ABI version %d.", d.Since))
			fmt.Fprintf(&b, "typedef struct %s %s;\n\n", d.CName, d.CName)
		}
	}

	b.WriteString("/* ---- Callbacks ---- */\n\n")
	for _, d := range m.Decls {
		if d.Kind == DCallback {
			cComment(&b, "", d.Doc+fmt.Sprintf("\n@since ABI version %d.", d.Since))
			fmt.Fprintf(&b, "typedef %s (*%s)(%s);\n\n", d.Callback.Result.CName(), d.CName, d.Callback.CParams())
		}
	}

	b.WriteString("/* ---- Structures ---- */\n\n")
	for _, d := range m.Decls {
		if d.Kind == DStruct {
			fmt.Fprintf(&b, "typedef struct %s %s;\n", d.CName, d.CName)
		}
	}
	b.WriteString("\n")
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		doc := d.Doc
		if d.Versioned {
			doc += fmt.Sprintf("\n\nVersioned: initialize with %s_INIT (or zero it and set struct_size and abi_version).", strings.ToUpper(d.CName))
		}
		cComment(&b, "", doc+fmt.Sprintf("\n@since ABI version %d.", d.Since))
		fmt.Fprintf(&b, "struct %s {\n", d.CName)
		for i, f := range d.Fields {
			fd := fieldTags(f) + f.Doc
			if f.Since != d.Since {
				fd += fmt.Sprintf(" (since ABI version %d)", f.Since)
			}
			cComment(&b, "    ", fd)
			align := ""
			if i == 0 && d.Align > 0 {
				align = fmt.Sprintf("%s_ALIGNAS(%d) ", P, d.Align)
			}
			fmt.Fprintf(&b, "    %s%s;\n", align, f.Type.CDecl(f.CName))
		}
		b.WriteString("};\n\n")
		if d.Versioned {
			fmt.Fprintf(&b, "/** Initializer of a %s: struct_size and abi_version set, every other field zero. */\n", d.CName)
			fmt.Fprintf(&b, "#define %s_INIT { (uint32_t)sizeof(%s), %s_ABI_VERSION }\n\n", strings.ToUpper(d.CName), d.CName, P)
		}
	}

	b.WriteString("/* ---- Functions ---- */\n\n")
	for _, f := range m.Funcs {
		cComment(&b, "", funcDoc(f, true))
		warn := ""
		if f.Sig.Result.IsStatus() {
			warn = P + "_WARN_UNUSED "
		}
		fmt.Fprintf(&b, "%s_API %s%s %s(%s);\n\n", P, warn, f.Sig.Result.CName(), f.CName, f.Sig.CParams())
	}

	if api := m.APIDecl(); api != nil {
		b.WriteString("/* ---- Function table ---- */\n\n")
		cComment(&b, "", api.Doc)
		fmt.Fprintf(&b, "struct %s {\n", api.CName)
		b.WriteString("    /** sizeof(the table) as built into the library. */\n    uint32_t struct_size;\n")
		b.WriteString("    /** The library's ABI version. */\n    uint32_t abi_version;\n")
		slots, _ := m.APILayout()
		for _, s := range slots {
			f := s.Func
			fmt.Fprintf(&b, "    /** %s (since ABI version %d). */\n", f.CName, f.Since)
			fmt.Fprintf(&b, "    %s (*%s)(%s);\n", f.Sig.Result.CName(), s.Name, f.Sig.CParams())
		}
		b.WriteString("};\n\n")
	}

	b.WriteString("/* ---- Layout checks: released layouts are frozen ---- */\n\n")
	fmt.Fprintf(&b, "#ifdef %s_STATIC_ASSERT\n", P)
	fmt.Fprintf(&b, "%s_STATIC_ASSERT(sizeof(void*) == 8, \"kvcm supports 64-bit platforms only\");\n", P)
	fmt.Fprintf(&b, "%s_STATIC_ASSERT(sizeof(size_t) == 8, \"kvcm supports 64-bit platforms only\");\n", P)
	fmt.Fprintf(&b, "%s_STATIC_ASSERT(sizeof(bool) == 1, \"kvcm needs a one-byte bool\");\n", P)
	for _, d := range m.Decls {
		if d.Kind != DStruct {
			continue
		}
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(sizeof(%s) == %d, \"layout of %s changed\");\n", P, d.CName, d.size, d.CName)
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(%s_ALIGNOF(%s) == %d, \"alignment of %s changed\");\n", P, P, d.CName, d.align, d.CName)
		for _, f := range d.Fields {
			fmt.Fprintf(&b, "%s_STATIC_ASSERT(offsetof(%s, %s) == %d, \"layout of %s changed\");\n", P, d.CName, f.CName, f.Offset, d.CName)
		}
	}
	if api := m.APIDecl(); api != nil {
		slots, size := m.APILayout()
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(sizeof(%s) == %d, \"layout of %s changed\");\n", P, api.CName, size, api.CName)
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(%s_ALIGNOF(%s) == 8, \"alignment of %s changed\");\n", P, P, api.CName, api.CName)
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(offsetof(%s, struct_size) == 0, \"layout of %s changed\");\n", P, api.CName, api.CName)
		fmt.Fprintf(&b, "%s_STATIC_ASSERT(offsetof(%s, abi_version) == 4, \"layout of %s changed\");\n", P, api.CName, api.CName)
		for _, s := range slots {
			fmt.Fprintf(&b, "%s_STATIC_ASSERT(offsetof(%s, %s) == %d, \"layout of %s changed\");\n", P, api.CName, s.Name, s.Offset, api.CName)
		}
	}
	b.WriteString("#endif\n\n")
	b.WriteString("#ifdef __cplusplus\n} /* extern \"C\" */\n#endif\n\n")
	fmt.Fprintf(&b, "#endif /* %s */\n", g)
	return b.String()
}
