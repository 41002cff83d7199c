package gen

import (
	"bytes"
	"fmt"
	"go/types"
	"path"
	"slices"
	"strings"

	"github.com/dave/jennifer/jen"
)

func init() { emitters = append(emitters, emitShim) }

// The shim is three generated files in the export package:
//
//   - shim_generated.h: C helpers every cgo file of the package includes:
//     const typedefs (so that exports can be declared with the header's
//     const pointers), prototypes of the internal exports, accessors for
//     void* struct fields and callers of vtable slots and callbacks that
//     carry opaque pointers as uintptr_t (Go never holds a foreign value in a
//     pointer-typed variable: a small integer there can crash the runtime),
//     and the v1 sizes of versioned structs.
//   - exports_generated.go: one //export per Go-implemented function: recover
//     and poison, consumption of consumed arguments on every path, NULL and
//     struct_size checks naming the argument, handle lookup, out-parameter
//     zeroing, then a call to the hand-written glue<Name> function.
//   - api_generated.c: kvcm_get_api's table and the public C wrappers of
//     functions that take void* (they forward to kvcm__go_<name> with
//     uintptr_t).
const (
	shimHeader = "shim_generated.h"
	shimGo     = "exports_generated.go"
	shimC      = "api_generated.c"

	// sliceArgBuf is the length of the array in an export's frame that a
	// short slice argument is copied into when it fits (see cSliceArg).
	sliceArgBuf = 8
)

// constTypedef is the name of the const typedef of a type used behind In[T].
func constTypedef(t *Type) string {
	return "kvcm__const_" + strings.ReplaceAll(t.CName(), " ", "_")
}

// hasVoidPtr reports whether a signature passes opaque pointers.
func hasVoidPtr(s *Sig) bool {
	for _, p := range s.Params {
		if p.Type.Kind == KVoidPtr || p.Type.Kind == KConstVoidPtr {
			return true
		}
	}
	return false
}

// exportName is the symbol the Go side exports for f.
func exportName(m *Model, f *Func) string {
	if hasVoidPtr(f.Sig) {
		return m.Prefix + "__go_" + strings.TrimPrefix(f.CName, m.Prefix+"_")
	}
	return f.CName
}

// shimCType renders the C type a Go export uses for a parameter: const
// pointers through their typedef, opaque pointers as uintptr_t.
func shimCType(t *Type) string {
	switch t.Kind {
	case KPtr:
		if t.Dir == DirIn {
			return constTypedef(t.Elem) + "*"
		}
		return t.CName()
	case KCStr:
		return "kvcm__const_char*"
	case KVoidPtr, KConstVoidPtr:
		return "uintptr_t"
	}
	return t.CName()
}

// goCType renders the cgo Go type of a parameter of an export.
func goCType(t *Type) jen.Code {
	switch t.Kind {
	case KPtr:
		if t.Dir == DirIn {
			return jen.Op("*").Qual("C", constTypedef(t.Elem))
		}
		return jen.Op("*").Add(goCType(t.Elem))
	case KCStr:
		return jen.Op("*").Qual("C", "kvcm__const_char")
	case KVoidPtr, KConstVoidPtr:
		return jen.Qual("C", "uintptr_t")
	case KSize:
		return jen.Qual("C", "size_t")
	case KScalar:
		return jen.Qual("C", t.Scalar)
	case KNamed:
		return jen.Qual("C", t.Decl.CName)
	}
	panic(fmt.Sprintf("gen: no cgo type for kind %d", t.Kind))
}

func emitShim(m *Model, p Paths) (map[string][]byte, error) {
	h := emitShimHeader(m)
	g, err := emitShimGo(m, p)
	if err != nil {
		return nil, err
	}
	c := emitShimC(m, p)
	return map[string][]byte{
		path.Join(p.ShimDir, shimHeader): []byte(h),
		path.Join(p.ShimDir, shimGo):     g,
		path.Join(p.ShimDir, shimC):      []byte(c),
	}, nil
}

func emitShimHeader(m *Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "/* %s */\n", Banner)
	b.WriteString("/* Internal helpers of the cgo export shim; not part of the public ABI. */\n")
	guard := strings.ToUpper(m.Prefix) + "_SHIM_GENERATED_H"
	fmt.Fprintf(&b, "#ifndef %s\n#define %s\n\n#include <stddef.h>\n#include <stdint.h>\n\n#include \"%s/%s.h\"\n\n", guard, guard, m.Prefix, m.Prefix)

	// Const typedefs for every In[T] element of every export, sorted.
	seen := map[string]string{"kvcm__const_char": "char"}
	var walk func(t *Type)
	walk = func(t *Type) {
		if t.Kind == KPtr && t.Dir == DirIn {
			seen[constTypedef(t.Elem)] = t.Elem.CName()
		}
	}
	for _, f := range m.Funcs {
		for _, p := range f.Sig.Params {
			walk(p.Type)
		}
	}
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	slices.Sort(names)
	b.WriteString("/* Const element types, so that Go exports match the header's const pointers. */\n")
	for _, n := range names {
		fmt.Fprintf(&b, "typedef const %s %s;\n", seen[n], n)
	}

	b.WriteString("\n/* Internal exports behind the public wrappers of functions that take void*. */\n")
	for _, f := range m.Funcs {
		if f.Impl == "go" && hasVoidPtr(f.Sig) {
			var ps []string
			for _, p := range f.Sig.Params {
				ps = append(ps, shimCType(p.Type)+" "+p.CName)
			}
			fmt.Fprintf(&b, "extern %s %s(%s);\n", f.Sig.Result.CName(), exportName(m, f), strings.Join(ps, ", "))
		}
	}

	b.WriteString("\n/* Versioned structs: the bytes struct_size must cover, per version. */\n")
	for _, d := range m.Decls {
		if d.Versioned {
			for v := d.Since; v <= m.MaxSince(); v++ {
				fmt.Fprintf(&b, "#define %s_SIZE_V%d %d\n", strings.ToUpper(strings.Replace(d.CName, m.Prefix+"_", m.Prefix+"__", 1)), v, d.SizeV(v))
			}
		}
	}

	b.WriteString("\n/* An address Go holds as uintptr_t, as a C pointer (the Go callers' address arguments). */\n")
	b.WriteString("static inline const void* kvcm__ptr(uintptr_t p) { return (const void*)p; }\n")
	b.WriteString("\n/* Opaque pointer fields, read and written as uintptr_t. */\n")
	for _, d := range m.Decls {
		userData := map[string]bool{} // a callback's user data, which the converters read in Go
		for _, f := range d.Fields {
			if f.User != "" {
				userData[f.User] = true
			}
		}
		for _, f := range d.Fields {
			if (f.Type.Kind == KVoidPtr || f.Type.Kind == KConstVoidPtr) && !userData[f.CName] {
				fmt.Fprintf(&b, "static inline uintptr_t kvcm__get_%s_%s(const %s* p) { return (uintptr_t)p->%s; }\n",
					strings.TrimPrefix(d.CName, m.Prefix+"_"), f.CName, d.CName, f.CName)
				fmt.Fprintf(&b, "static inline void kvcm__set_%s_%s(%s* p, uintptr_t v) { p->%s = (%s)v; }\n",
					strings.TrimPrefix(d.CName, m.Prefix+"_"), f.CName, d.CName, f.CName, f.Type.CName())
			}
		}
	}

	b.WriteString("\n/* Vtable slots: presence (struct_size covers the slot and it is non-null) and callers. */\n")
	for _, d := range m.Decls {
		if !d.Vtable {
			continue
		}
		short := strings.TrimPrefix(d.CName, m.Prefix+"_")
		for _, f := range d.Fields {
			if f.Type.Kind != KFunc {
				continue
			}
			fmt.Fprintf(&b, "static inline int kvcm__has_%s_%s(const %s* vt) {\n", short, f.CName, d.CName)
			fmt.Fprintf(&b, "    return vt != NULL && vt->struct_size >= offsetof(%s, %s) + sizeof(vt->%s) && vt->%s != NULL;\n}\n",
				d.CName, f.CName, f.CName, f.CName)
			writeCaller(&b, fmt.Sprintf("kvcm__call_%s_%s", short, f.CName), "const "+d.CName+"* vt", "vt->"+f.CName, f.Type.Sig)
		}
		var required []*Field
		for _, f := range goImplSlots(d) {
			if !f.Nullable {
				required = append(required, f)
			}
		}
		if len(required) > 0 {
			fmt.Fprintf(&b, "/* The first slot of a %s that must be present and is not, or NULL. */\n", d.CName)
			fmt.Fprintf(&b, "static inline const char* kvcm__missing_%s(const %s* vt) {\n", short, d.CName)
			for _, f := range required {
				fmt.Fprintf(&b, "    if (!kvcm__has_%s_%s(vt)) {\n        return \"%s\";\n    }\n", short, f.CName, f.CName)
			}
			b.WriteString("    return NULL;\n}\n")
		}
	}
	b.WriteString("\n/* Go implementations of vtables (defined in " + shimC + "): each slot forwards to a Go export, self and pointers as uintptr_t. */\n")
	for _, d := range m.Decls {
		for _, impl := range d.GoImpls {
			for _, f := range goImplSlots(d) {
				fmt.Fprintf(&b, "extern %s;\n", goImplExport(impl.Impl, f))
			}
			fmt.Fprintf(&b, "const %s* %s(void);\n", d.CName, goImplTable(m, d, impl.Impl))
		}
	}
	b.WriteString("\n/* Callbacks: callers that take opaque pointers as uintptr_t. */\n")
	for _, d := range m.Decls {
		if d.Kind == DCallback {
			short := strings.TrimPrefix(d.CName, m.Prefix+"_")
			writeCaller(&b, "kvcm__call_"+short, d.CName+" fn", "fn", d.Callback)
		}
	}
	b.WriteString("\n/* Enumerator names (defined in " + shimC + "). */\n")
	for _, d := range m.Decls {
		if d.Kind == DEnum {
			fmt.Fprintf(&b, "const char* kvcm__enum_name_%s(%s v);\n", strings.TrimPrefix(d.CName, m.Prefix+"_"), d.CName)
		}
	}
	fmt.Fprintf(&b, "\n#endif /* %s */\n", guard)
	return b.String()
}

// writeCaller writes a static inline function that calls target with the
// signature's parameters, opaque pointers passed in as uintptr_t.
func writeCaller(b *strings.Builder, name, first, target string, s *Sig) {
	params := []string{first}
	var args []string
	for _, p := range s.Params {
		switch p.Type.Kind {
		case KVoidPtr, KConstVoidPtr:
			params = append(params, "uintptr_t "+p.CName)
			args = append(args, "("+p.Type.CName()+")"+p.CName)
		default:
			params = append(params, p.Type.CDecl(p.CName))
			args = append(args, p.CName)
		}
	}
	ret := "return "
	if s.Result.Kind == KVoid {
		ret = ""
	}
	fmt.Fprintf(b, "static inline %s %s(%s) { %s%s(%s); }\n", s.Result.CName(), name, strings.Join(params, ", "), ret, target, strings.Join(args, ", "))
}

// goImplSlots returns the function slots of a vtable.
func goImplSlots(d *Decl) []*Field {
	var out []*Field
	for _, f := range d.Fields {
		if f.Type.Kind == KFunc {
			out = append(out, f)
		}
	}
	return out
}

// goImplExport declares the Go export a slot of a Go-implemented vtable
// forwards to: pointers (self included) as uintptr_t, as Go must hold them.
func goImplExport(impl string, f *Field) string {
	var ps []string
	for _, p := range f.Type.Sig.Params {
		t := p.Type.CName()
		if p.Type.IsPointer() {
			t = "uintptr_t"
		}
		ps = append(ps, t+" "+p.CName)
	}
	return fmt.Sprintf("%s kvcm__go_%s_%s(%s)", f.Type.Sig.Result.CName(), impl, f.CName, strings.Join(ps, ", "))
}

// goImplTable is the accessor of a Go implementation's vtable.
func goImplTable(m *Model, d *Decl, impl string) string {
	return fmt.Sprintf("%s__%s_%s", m.Prefix, impl, strings.TrimPrefix(d.CName, m.Prefix+"_"))
}

// writeGoImpl writes the forwarding slots of a Go implementation of a
// vtable, its table and the table's accessor.
func writeGoImpl(b *strings.Builder, m *Model, d *Decl, impl string) {
	short := strings.TrimPrefix(d.CName, m.Prefix+"_")
	for _, f := range goImplSlots(d) {
		var args []string
		for _, p := range f.Type.Sig.Params {
			if p.Type.IsPointer() {
				args = append(args, "(uintptr_t)"+p.CName)
			} else {
				args = append(args, p.CName)
			}
		}
		ret := "return "
		if f.Type.Sig.Result.Kind == KVoid {
			ret = ""
		}
		fmt.Fprintf(b, "static %s %s_%s_%s(%s) {\n    %skvcm__go_%s_%s(%s);\n}\n\n", f.Type.Sig.Result.CName(), impl, short, f.CName,
			f.Type.Sig.CParams(), ret, impl, f.CName, strings.Join(args, ", "))
	}
	fmt.Fprintf(b, "static const %s %s_%s = {\n", d.CName, impl, short)
	if d.Versioned {
		fmt.Fprintf(b, "    .struct_size = (uint32_t)sizeof(%s),\n    .abi_version = %s_ABI_VERSION,\n", d.CName, strings.ToUpper(m.Prefix))
	}
	for _, f := range goImplSlots(d) {
		fmt.Fprintf(b, "    .%s = %s_%s_%s,\n", f.CName, impl, short, f.CName)
	}
	b.WriteString("};\n\n")
	fmt.Fprintf(b, "const %s* %s(void) {\n    return &%s_%s;\n}\n\n", d.CName, goImplTable(m, d, impl), impl, short)
}

func emitShimC(m *Model, p Paths) string {
	var b strings.Builder
	fmt.Fprintf(&b, "/* %s */\n", Banner)
	b.WriteString("/* The function table and the public wrappers of functions that take void*. */\n")
	fmt.Fprintf(&b, "#include <stddef.h>\n#include <stdint.h>\n\n#include \"%s\"\n#include \"%s\"\n\n", p.Include, shimHeader)
	for _, f := range m.Funcs {
		if f.Impl != "go" || !hasVoidPtr(f.Sig) {
			continue
		}
		var args []string
		for _, p := range f.Sig.Params {
			if p.Type.Kind == KVoidPtr || p.Type.Kind == KConstVoidPtr {
				args = append(args, "(uintptr_t)"+p.CName)
			} else {
				args = append(args, p.CName)
			}
		}
		fmt.Fprintf(&b, "%s %s(%s) {\n    return %s(%s);\n}\n\n", f.Sig.Result.CName(), f.CName, f.Sig.CParams(), exportName(m, f), strings.Join(args, ", "))
	}
	for _, d := range m.Decls {
		if d.Kind != DEnum {
			continue
		}
		fmt.Fprintf(&b, "const char* kvcm__enum_name_%s(%s v) {\n    switch (v) {\n", strings.TrimPrefix(d.CName, m.Prefix+"_"), d.CName)
		for _, e := range d.Members {
			fmt.Fprintf(&b, "    case %s:\n        return \"%s\";\n", e.CName, e.CName)
		}
		fmt.Fprintf(&b, "    }\n    return NULL;\n}\n\n")
	}
	for _, d := range m.Decls {
		for _, impl := range d.GoImpls {
			writeGoImpl(&b, m, d, impl.Impl)
		}
	}
	api := m.APIDecl()
	var entry *Func
	for _, f := range m.Funcs {
		if f.Impl == "api" {
			entry = f
		}
	}
	if api != nil && entry != nil {
		fmt.Fprintf(&b, "static const %s %s__table = {\n", api.CName, m.Prefix)
		fmt.Fprintf(&b, "    (uint32_t)sizeof(%s),\n    %s_ABI_VERSION,\n", api.CName, strings.ToUpper(m.Prefix))
		for _, f := range m.TableFuncs() {
			fmt.Fprintf(&b, "    %s,\n", f.CName)
		}
		b.WriteString("};\n\n")
		fmt.Fprintf(&b, "const %s* %s(uint32_t %s) {\n", api.CName, entry.CName, entry.Sig.Params[0].CName)
		v := entry.Sig.Params[0].CName
		fmt.Fprintf(&b, "    if (%s == 0 || %s > %s_ABI_VERSION) {\n        return NULL;\n    }\n", v, v, strings.ToUpper(m.Prefix))
		fmt.Fprintf(&b, "    return &%s__table;\n}\n", m.Prefix)
	}
	return b.String()
}

func emitShimGo(m *Model, p Paths) ([]byte, error) {
	f := jen.NewFile(p.ShimPkg)
	f.HeaderComment(Banner)
	f.CgoPreamble(fmt.Sprintf("#cgo CFLAGS: -I${SRCDIR}/%s\n#include \"%s\"\n#include \"%s\"\n#include \"%s_internal.h\"",
		relInclude(p), p.Include, shimHeader, m.Prefix))
	for _, fn := range m.Funcs {
		if fn.Impl != "go" {
			continue
		}
		code, err := shimFunc(m, fn)
		if err != nil {
			return nil, err
		}
		f.Comment(code.doc)
		f.Comment("//export " + code.name)
		f.Add(code.fn)
		f.Line()
	}
	for _, d := range m.Decls {
		if d.GoCodes == "" {
			continue
		}
		var codes []jen.Code
		for _, e := range d.Members {
			codes = append(codes, jen.Id(d.GoCodes+e.Trimmed).Op("=").Qual("C", e.CName))
		}
		f.Comment(fmt.Sprintf("The members of %s, as the header defines them.", d.CName))
		f.Const().Defs(codes...)
		f.Line()
	}
	var kinds []jen.Code
	for _, d := range m.Decls {
		if d.GoHandle == "" {
			continue
		}
		obj := jen.Op("*").Id(d.GoHandle)
		f.Comment(fmt.Sprintf("lookup%s resolves a %s argument to its %s, or reports", d.GoName, d.CName, d.GoHandleWhat))
		f.Comment("KVCM_ERR_INVALID_HANDLE naming the argument.")
		f.Func().Id("lookup"+d.GoName).Params(jen.List(jen.Id("fn"), jen.Id("arg")).String(), jen.Id("h").Qual("C", d.CName)).
			Params(obj, jen.Op("*").Qual("C", m.StatusDecl().CName)).Block(
			jen.Return(jen.Id("lookup").Index(obj).Call(jen.Id("fn"), jen.Id("arg"), jen.Uint64().Call(jen.Id("h")), jen.Lit(d.GoHandleWhat))))
		f.Line()
		kinds = append(kinds, jen.Case(obj).Block(jen.Return(jen.Lit(d.GoHandleWhat), jen.True())))
	}
	if len(kinds) > 0 {
		f.Comment("handleKind names the kind of a handle's value, for errors.")
		f.Func().Id("handleKind").Params(jen.Id("v").Any()).Params(jen.String(), jen.Bool()).Block(
			jen.Switch(jen.Id("v").Assert(jen.Type())).Block(kinds...),
			jen.Return(jen.Lit(""), jen.False()))
		f.Line()
	}
	for _, d := range m.Decls {
		for _, impl := range d.GoImpls {
			f.Add(goImplLookup(d, impl))
			f.Line()
			for _, slot := range goImplSlots(d) {
				name, fn := goImplSlotExport(d, impl, slot)
				f.Comment(fmt.Sprintf("%s is the %s slot of the %s %s.", name, slot.CName, impl.Impl, d.CName))
				f.Comment("//export " + name)
				f.Add(fn)
				f.Line()
			}
		}
	}
	var buf bytes.Buffer
	if err := f.Render(&buf); err != nil {
		return nil, fmt.Errorf("render shim: %w", err)
	}
	return buf.Bytes(), nil
}

// relInclude is the include directory relative to the shim directory.
func relInclude(p Paths) string {
	depth := len(strings.Split(path.Clean(p.ShimDir), "/"))
	return strings.Repeat("../", depth) + path.Dir(path.Dir(p.Header))
}

type shimCode struct {
	name, doc string
	fn        *jen.Statement
}

func shimFunc(m *Model, fn *Func) (shimCode, error) {
	name := exportName(m, fn)
	status := fn.Sig.Result.IsStatus()
	var params []jen.Code
	for _, p := range fn.Sig.Params {
		params = append(params, jen.Id(p.CName).Add(goCType(p.Type)))
	}
	var result jen.Code
	if status {
		result = jen.Id("status").Op("*").Qual("C", m.StatusDecl().CName)
	} else if fn.Sig.Result.Kind != KVoid {
		result = jen.Id("result").Add(goCType(fn.Sig.Result))
	}
	var body []jen.Code
	body = append(body, jen.Const().Id("kvcmFn").Op("=").Lit(fn.CName))
	if status {
		body = append(body, jen.Defer().Func().Params().Block(
			jen.If(jen.Id("r").Op(":=").Recover(), jen.Id("r").Op("!=").Nil()).Block(
				jen.Id("status").Op("=").Id("panicStatus").Call(jen.Id("kvcmFn"), jen.Id("r")),
			),
		).Call())
	} else {
		body = append(body, jen.Defer().Func().Params().Block(
			jen.If(jen.Id("r").Op(":=").Recover(), jen.Id("r").Op("!=").Nil()).Block(
				jen.Id("poison").Call(jen.Id("kvcmFn"), jen.Id("r")),
			),
		).Call())
	}
	args := map[string]jen.Code{}
	// Consumed struct arguments are taken first, so they are released on
	// every path below (poisoned library and bad arguments included).
	for _, p := range fn.Sig.Params {
		args[p.CName] = jen.Id(p.CName)
		if p.Has("consumed") && p.Type.Kind == KPtr && p.Type.Elem.Kind == KNamed && p.Type.Elem.Decl.Kind == DStruct {
			v := lowerCamel(p.CName) + "Arg"
			body = append(body,
				jen.Id(v).Op(":=").Id("consume"+p.Type.Elem.Decl.GoName).Call(jen.Id(p.CName)),
				jen.Defer().Id(v).Dot("release").Call())
			args[p.CName] = jen.Id(v)
		}
	}
	// Zero the out-parameters (not buffers) so that a failure leaves them 0.
	for _, p := range fn.Sig.Params {
		if p.Type.Kind == KPtr && p.Type.Dir == DirOut && p.Len == "" && !p.Has("consumed") {
			var zero jen.Code = jen.Lit(0)
			switch {
			case p.Type.Elem.Kind == KNamed && p.Type.Elem.Decl.Kind == DStruct:
				zero = jen.Qual("C", p.Type.Elem.Decl.CName).Values()
			case p.Type.Elem.Kind == KScalar && p.Type.Elem.Scalar == "bool":
				zero = jen.False()
			}
			body = append(body, jen.If(jen.Id(p.CName).Op("!=").Nil()).Block(jen.Op("*").Id(p.CName).Op("=").Add(zero)))
		}
	}
	fail := func(c jen.Code) jen.Code {
		if status {
			return jen.Return(c)
		}
		return jen.Id("discardStatus").Call(c).Line().Return()
	}
	if status {
		body = append(body, jen.If(jen.Id("isPoisoned").Call()).Block(jen.Return(jen.Id("poisonedStatus").Call(jen.Id("kvcmFn")))))
	}
	for _, p := range fn.Sig.Params {
		if !status {
			break
		}
		var isNil jen.Code
		switch p.Type.Kind {
		case KPtr, KCStr:
			isNil = jen.Id(p.CName).Op("==").Nil()
		case KVoidPtr, KConstVoidPtr:
			isNil = jen.Id(p.CName).Op("==").Lit(0)
		case KNamed:
			if p.Type.Decl.Kind == DCallback {
				isNil = jen.Id(p.CName).Op("==").Nil()
			}
		}
		if isNil == nil {
			continue
		}
		if p.Nullable && p.Len != "" {
			body = append(body, jen.If(jen.Add(isNil).Op("&&").Id(p.Len).Op("!=").Lit(0)).Block(
				jen.Return(jen.Id("argStatus").Call(jen.Id("kvcmFn"), jen.Lit(p.CName),
					jen.Qual("fmt", "Sprintf").Call(jen.Lit("is NULL but "+p.Len+" is %d"), jen.Id(p.Len)))),
			))
		} else if !p.Nullable {
			body = append(body, jen.If(isNil).Block(
				jen.Return(jen.Id("argStatus").Call(jen.Id("kvcmFn"), jen.Lit(p.CName), jen.Lit("must not be NULL"))),
			))
		}
	}
	for _, p := range fn.Sig.Params {
		if !status {
			break
		}
		if p.Type.Kind == KPtr && p.Type.Dir == DirIn && p.Type.Elem.Kind == KNamed && p.Type.Elem.Decl.Versioned && !p.Has("consumed") {
			d := p.Type.Elem.Decl
			body = append(body, jen.If(
				jen.Id("st").Op(":=").Id("checkVersion").Call(jen.Id("kvcmFn"), jen.Lit(p.CName),
					jen.Uint32().Call(jen.Id(p.CName).Dot("struct_size")), jen.Uint32().Call(jen.Id(p.CName).Dot("abi_version")),
					jen.Uint32().Call(jen.Qual("C", strings.ToUpper(strings.Replace(d.CName, m.Prefix+"_", m.Prefix+"__", 1))+fmt.Sprintf("_SIZE_V%d", d.Since)))),
				jen.Id("st").Op("!=").Nil()).Block(jen.Return(jen.Id("st"))))
		}
	}
	for _, p := range fn.Sig.Params {
		if p.Type.Kind != KNamed || p.Type.Decl.Kind != DHandle {
			continue
		}
		v := lowerCamel(p.CName) + "Obj"
		body = append(body,
			jen.List(jen.Id(v), jen.Id("st")).Op(":=").Id("lookup"+p.Type.Decl.GoName).Call(jen.Id("kvcmFn"), jen.Lit(p.CName), jen.Id(p.CName)),
			jen.If(jen.Id("st").Op("!=").Nil()).Block(fail(jen.Id("st"))))
		args[p.CName] = jen.Id(v)
	}
	// Conventions: the glue gets Go strings and slices, and returns the
	// values of results, sized outputs and a buffer, which the export writes.
	skip := map[string]bool{}
	var buffer *Param
	var outs, nested, intos, columns []*Param
	var rooms []jen.Code // a take buffer's: the room of it and of its nested buffer
	ifErr := jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Err())))
	for _, p := range fn.Sig.Params {
		v := lowerCamel(p.CName) + "Arg"
		switch {
		case p.Into != "":
			intos = append(intos, p)
			skip[p.CName] = true
			continue
		case p.Of != "":
			nested = append(nested, p)
			skip[p.CName], skip[p.Len], skip[p.Buffer] = true, true, true
			if paramOf(fn, p.Of).Has("take") {
				body = append(body, jen.List(jen.Id(lowerCamel(p.CName)+"Out"), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id(p.CName), jen.Id(p.Len), jen.Lit(p.Len)), ifErr)
				rooms = append(rooms, jen.Len(jen.Id(lowerCamel(p.CName)+"Out")))
			}
			continue
		case p.ColumnOf != "":
			columns = append(columns, p)
			skip[p.CName], skip[p.Len] = true, true
			continue
		case p.Has("convert") && p.Len != "":
			d := p.Type.Elem.Decl
			body = append(body, jen.List(jen.Id(v), jen.Err()).Op(":=").Id("cStructsArg").Call(
				jen.Parens(jen.Op("*").Qual("C", d.CName)).Call(jen.Id(p.CName)), jen.Id(p.Len), jen.Lit(p.CName), jen.Id("fromC"+d.GoName)), ifErr)
		case p.Has("convert"):
			d := p.Type.Elem.Decl
			body = append(body, jen.List(jen.Id(v), jen.Err()).Op(":=").Id("fromC"+d.GoName).Call(
				jen.Parens(jen.Op("*").Qual("C", d.CName)).Call(jen.Id(p.CName)), jen.Lit(p.CName)), ifErr)
			args[p.CName] = jen.Id(v)
			continue
		case p.Has("string") && p.Len == "":
			// NUL-terminated: the export rejected NULL unless nullable (then "").
			var str jen.Code = jen.Id("cString").Call(jen.Parens(jen.Op("*").Qual("C", "char")).Call(jen.Id(p.CName)))
			if p.GoElem != "" {
				str = jen.Add(goElemCode(p.GoElem)).Call(str)
			}
			body = append(body, jen.Id(v).Op(":=").Add(str))
			args[p.CName] = jen.Id(v)
			continue
		case p.Has("string"):
			body = append(body, jen.List(jen.Id(v), jen.Err()).Op(":=").Id("cStringArg").Call(
				jen.Parens(jen.Op("*").Qual("C", "char")).Call(jen.Id(p.CName)), jen.Id(p.Len), jen.Lit(p.Len)), ifErr)
		case p.Has("slice"):
			buf := jen.Nil()
			if p.Has("short") {
				name := lowerCamel(p.CName) + "Buf"
				body = append(body, jen.Var().Id(name).Index(jen.Lit(sliceArgBuf)).Add(goElemCode(p.GoElem)))
				buf = jen.Id(name).Index(jen.Op(":"))
			}
			helper := "cSliceArg"
			if p.Has("nullnil") {
				helper = "cSliceArgNil"
			}
			body = append(body, jen.List(jen.Id(v), jen.Err()).Op(":=").Id(helper).Index(goElemCode(p.GoElem)).Call(
				buf, jen.Id(p.CName), jen.Id(p.Len), jen.Lit(p.CName)), ifErr)
		case p.Buffer != "":
			buffer = p
			outs = append(outs, p)
			skip[p.CName], skip[p.Len], skip[p.Buffer] = true, true, true
			if p.Has("reset") {
				// The glue gets the room the caller's buffer has, so that a
				// size query or a buffer too small resets nothing.
				body = append(body, jen.List(jen.Id("room"), jen.Err()).Op(":=").Id("bufferRoom").Call(jen.Id(p.CName), jen.Id(p.Len)), ifErr)
			}
			if p.Has("take") {
				body = append(body, jen.List(jen.Id(lowerCamel(p.CName)+"Out"), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id(p.CName), jen.Id(p.Len), jen.Lit(p.Len)), ifErr)
				rooms = append([]jen.Code{jen.Len(jen.Id(lowerCamel(p.CName) + "Out"))}, rooms...)
			}
			continue
		case p.Has("result"), p.Has("sized"):
			outs = append(outs, p)
			skip[p.CName] = true
			continue
		default:
			continue
		}
		args[p.CName], skip[p.Len] = jen.Id(v), true
	}
	for _, p := range intos {
		q := paramOf(fn, p.Into)
		obj, _, _ := types.LookupFieldOrMethod(q.Type.Elem.Decl.GoMap.Type, false, nil, p.IntoField)
		fv, ok := obj.(*types.Var)
		if !ok || !fv.IsField() {
			return shimCode{}, fmt.Errorf("%s: %s: into=%s.%s: %s has no field %s", fn.GoName, p.GoName, q.GoName, p.IntoField, q.Type.Elem.Decl.GoMap.Name, p.IntoField)
		}
		body = append(body, jen.Id(lowerCamel(q.CName)+"Arg").Dot(p.IntoField).Op("=").Add(castTo(fv.Type(), jen.Id(p.CName))))
	}
	var call []jen.Code
	for _, p := range fn.Sig.Params {
		if !skip[p.CName] {
			call = append(call, args[p.CName])
		}
	}
	if buffer != nil && buffer.Has("reset") {
		call = append(call, jen.Id("room"))
	}
	call = append(call, rooms...)
	glue := jen.Id("glue" + fn.GoName).Call(call...)
	values := len(outs)
	if buffer != nil && (buffer.Has("reset") || buffer.Has("take")) {
		values++
	}
	callErr := true
	if fn.Call != "" {
		if !status {
			return shimCode{}, fmt.Errorf("%s: //kvcm:call needs a kvcm_status* result", fn.GoName)
		}
		var err error
		if glue, callErr, err = callExpr(fn, call, values); err != nil {
			return shimCode{}, err
		}
	}
	switch {
	case len(outs) > 0:
		var rets []jen.Code
		for _, o := range outs {
			switch {
			case o == buffer && o.Has("reset"):
				rets = append(rets, jen.Id("items"), jen.Id("n"))
			case o == buffer && o.Has("take"):
				rets = append(rets, jen.Id("items"), jen.Id("need"))
			case o == buffer:
				rets = append(rets, jen.Id("items"))
			default:
				rets = append(rets, jen.Id(lowerCamel(o.CName)+"Out"))
			}
		}
		if callErr {
			body = append(body, jen.List(append(rets, jen.Err())...).Op(":=").Add(glue), ifErr)
		} else {
			body = append(body, jen.List(rets...).Op(":=").Add(glue))
		}
		if buffer != nil && buffer.Has("take") {
			n := nested[0]
			body = append(body, jen.If(jen.Id("need").Op(">").Lit(0)).Block(
				jen.Op("*").Id(n.Buffer).Op("=").Qual("C", "size_t").Call(jen.Id("need")),
				jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("errorf").Call(jen.Id("codeBufferTooSmall"),
					jen.Lit("the first of the "+buffer.CName+" to take needs %d "+n.CName+"; "+n.Len+" is %d"), jen.Id("need"), jen.Id("uint64").Call(jen.Id(n.Len)))))))
		}
		for _, o := range outs {
			if o.Has("result") {
				el := o.Type.Elem
				var v jen.Code = jen.Add(goCType(el)).Call(jen.Id(lowerCamel(o.CName) + "Out"))
				if el.Kind == KNamed && el.Decl.Kind == DStruct {
					v = jen.Id("toC" + el.Decl.GoName).Call(jen.Id(lowerCamel(o.CName) + "Out"))
				}
				write := jen.Op("*").Id(o.CName).Op("=").Add(v)
				if o.Nullable {
					write = jen.If(jen.Id(o.CName).Op("!=").Nil()).Block(write)
				}
				body = append(body, write)
			}
		}
		for _, o := range outs {
			if o.Has("sized") {
				body = append(body, jen.If(jen.Err().Op(":=").Id("fillSized").Call(jen.Id(lowerCamel(o.CName)+"Out"), jen.Id(o.CName), jen.Id(o.Len),
					jen.Lit(o.Len), elemConv(o)), jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Err()))))
			}
		}
		switch {
		case buffer == nil:
			body = append(body, jen.Return(jen.Nil()))
		case buffer.Has("take"):
			body = append(body, takeFill(buffer, nested[0])...)
		case len(nested) > 0:
			st, err := nestedFill(fn, buffer, nested, ifErr)
			if err != nil {
				return shimCode{}, err
			}
			body = append(body, st...)
		case buffer.Column != "":
			body = append(body, columnFill(buffer, columns, ifErr)...)
		case buffer.Has("reset"):
			body = append(body, jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("fillTaken").Call(jen.Id("items"), jen.Id("n"), jen.Id(buffer.CName), jen.Id(buffer.Len), jen.Id(buffer.Buffer), elemConv(buffer)))))
		default:
			body = append(body, jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("fill").Call(jen.Id("items"), jen.Id(buffer.CName), jen.Id(buffer.Len), jen.Id(buffer.Buffer), elemConv(buffer)))))
		}
	case status && !callErr:
		body = append(body, glue, jen.Return(jen.Nil()))
	case status:
		body = append(body, jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), glue)))
	case fn.Sig.Result.Kind == KVoid:
		body = append(body, glue)
	default:
		body = append(body, jen.Return(glue))
	}
	doc := fmt.Sprintf("%s is the export of %s (ABI version %d).", name, fn.CName, fn.Since)
	sig := jen.Func().Id(name).Params(params...)
	if result != nil {
		sig = sig.Parens(result)
	}
	return shimCode{name: name, doc: doc, fn: sig.Block(body...)}, nil
}

// callExpr is the call of a function's //kvcm:call with the arguments the
// glue would get (the receiver first, for a method chain), each cast to the
// parameter's type, and whether it returns an error after its values
// (which must be the function's outputs, values of them).
func callExpr(fn *Func, call []jen.Code, values int) (*jen.Statement, bool, error) {
	sig := fn.CallSig
	var x *jen.Statement
	args := call
	segs := strings.Split(fn.Call, ".")
	if path, chain, ok := callPackage(fn.Call); ok {
		segs = strings.Split(chain, ".")
		x = jen.Qual(path, strings.TrimSuffix(segs[0], "()"))
		if len(segs) > 1 && strings.HasSuffix(segs[0], "()") {
			x = x.Call()
		}
		segs = segs[1:]
	} else {
		x, args = jen.Add(call[0]), call[1:]
	}
	for i, seg := range segs {
		x = x.Dot(strings.TrimSuffix(seg, "()"))
		if i < len(segs)-1 && strings.HasSuffix(seg, "()") {
			x = x.Call()
		}
	}
	where := fmt.Sprintf("%s: //kvcm:call %s", fn.GoName, fn.Call)
	if sig.Params().Len() != len(args) || sig.Variadic() {
		return nil, false, fmt.Errorf("%s: takes %d arguments, the function has %d to give it", where, sig.Params().Len(), len(args))
	}
	var cast []jen.Code
	for i, a := range args {
		cast = append(cast, castTo(sig.Params().At(i).Type(), a))
	}
	n := sig.Results().Len()
	hasErr := n > 0 && types.Identical(sig.Results().At(n-1).Type(), types.Universe.Lookup("error").Type())
	if hasErr {
		n--
	}
	if n != values {
		return nil, false, fmt.Errorf("%s: returns %d values, the function has %d outputs", where, n, values)
	}
	return x.Call(cast...), hasErr, nil
}

// elemConv is the conversion of a buffer's or sized output's Go elements
// to its C elements: a cast to go=, or the elements' toC converter.
func elemConv(p *Param) jen.Code {
	el := p.Type.Elem
	if p.GoElem != "" {
		return jen.Func().Params(jen.Id("v").Add(goElemCode(p.GoElem))).Add(goCType(el)).Block(jen.Return(jen.Add(goCType(el)).Call(jen.Id("v"))))
	}
	return jen.Id("toC" + el.Decl.GoName)
}

// nestedFill writes the elements of a buffer whose structs have arrays,
// each array into its nested buffer (of=), one element's run after
// another: every count is written first; NULL buffers with capacity 0 ask
// for the counts only; a buffer smaller than its count is
// KVCM_ERR_BUFFER_TOO_SMALL, writing nothing else.
func nestedFill(fn *Func, buffer *Param, nested []*Param, ifErr jen.Code) ([]jen.Code, error) {
	d := buffer.Type.Elem.Decl
	byField := map[string]*Param{}
	for _, n := range nested {
		if n.Of != buffer.CName {
			return nil, fmt.Errorf("%s: %s: of names %s, not the function's buffer %s", fn.GoName, n.GoName, n.Of, buffer.CName)
		}
		byField[n.OfField] = n
	}
	goField := func(f *Field) *jen.Statement {
		src := jen.Id("it")
		for _, name := range strings.Split(f.GoField(), ".") {
			src = src.Dot(name)
		}
		return src
	}
	var arrays []*Field
	for _, f := range MappedFields(d) {
		if isOutArray(f) {
			if byField[f.CName] == nil {
				return nil, fmt.Errorf("%s: %s.%s has no nested buffer: add a parameter with of=%s.%s", fn.GoName, d.CName, f.CName, buffer.GoName, f.CName)
			}
			arrays = append(arrays, f)
		}
	}
	total := func(n *Param) jen.Code { return jen.Id(lowerCamel(n.CName) + "Need") }
	out := func(p *Param) *jen.Statement { return jen.Id(lowerCamel(p.CName) + "Out") }
	at := func(n *Param) *jen.Statement { return jen.Id(lowerCamel(n.CName) + "At") }
	var st, sums, counts, empty, small, need, room, conv, advance []jen.Code
	counts = append(counts, jen.Op("*").Id(buffer.Buffer).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("items"))))
	empty = append(empty, jen.Id(buffer.CName).Op("==").Nil().Op("&&").Id(buffer.Len).Op("==").Lit(0))
	small = append(small, jen.Len(out(buffer)).Op("<").Len(jen.Id("items")))
	need = append(need, jen.Len(jen.Id("items")))
	room = append(room, jen.Len(out(buffer)))
	msg := []string{"%d " + buffer.CName}
	conv = append(conv, jen.Id("it"))
	views := []jen.Code{jen.List(out(buffer), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id(buffer.CName), jen.Id(buffer.Len), jen.Lit(buffer.Len)), ifErr}
	for _, f := range arrays {
		n := byField[f.CName]
		st = append(st, jen.Add(total(n)).Op(":=").Lit(0))
		sums = append(sums, jen.Add(total(n)).Op("+=").Len(goField(f)))
		if n.Buffer != "" {
			counts = append(counts, jen.Op("*").Id(n.Buffer).Op("=").Qual("C", "size_t").Call(total(n)))
		}
		empty = append(empty, jen.Op("&&").Id(n.CName).Op("==").Nil().Op("&&").Id(n.Len).Op("==").Lit(0))
		views = append(views, jen.List(out(n), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id(n.CName), jen.Id(n.Len), jen.Lit(n.Len)), ifErr)
		small = append(small, jen.Op("||").Len(out(n)).Op("<").Add(total(n)))
		need = append(need, total(n))
		room = append(room, jen.Len(out(n)))
		msg = append(msg, "%d "+n.CName)
		conv = append(conv, out(n).Index(jen.Add(at(n)).Op(":")))
		advance = append(advance, jen.Add(at(n)).Op("+=").Len(goField(f)))
	}
	st = append(st, jen.For(jen.List(jen.Id("_"), jen.Id("it")).Op(":=").Range().Id("items")).Block(sums...))
	st = append(st, counts...)
	st = append(st, jen.If(jen.Add(empty...)).Block(jen.Return(jen.Nil())))
	st = append(st, views...)
	roomMsg := strings.Repeat("%d, ", len(msg)-1) + "%d"
	tooSmall := append([]jen.Code{jen.Id("codeBufferTooSmall"), jen.Lit("need room for " + strings.Join(msg, ", ") + "; got room for " + roomMsg)}, need...)
	tooSmall = append(tooSmall, room...)
	st = append(st, jen.If(jen.Add(small...)).Block(jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("errorf").Call(tooSmall...)))))
	for _, f := range arrays {
		st = append(st, jen.Add(at(byField[f.CName])).Op(":=").Lit(0))
	}
	st = append(st, jen.For(jen.List(jen.Id("i"), jen.Id("it")).Op(":=").Range().Id("items")).Block(
		append([]jen.Code{out(buffer).Index(jen.Id("i")).Op("=").Id("toC" + d.GoName).Call(conv...)}, advance...)...))
	return append(st, jen.Return(jen.Nil())), nil
}

// takeFill writes the elements a take buffer's glue took (as many as fit
// the buffer and, their arrays one element's run after another, its nested
// buffer: more is KVCM_ERR_INTERNAL), pointing each element's array field
// at its run (NULL for none), and the counts written.
func takeFill(buffer, n *Param) []jen.Code {
	d := buffer.Type.Elem.Decl
	var f *Field
	for _, g := range MappedFields(d) {
		if g.CName == n.OfField {
			f = g
		}
	}
	src := jen.Id("it")
	for _, name := range strings.Split(f.GoField(), ".") {
		src = src.Dot(name)
	}
	out := func(p *Param) *jen.Statement { return jen.Id(lowerCamel(p.CName) + "Out") }
	at := jen.Id(lowerCamel(n.CName) + "At")
	return []jen.Code{
		jen.Add(at).Op(":=").Lit(0),
		jen.For(jen.List(jen.Id("_"), jen.Id("it")).Op(":=").Range().Id("items")).Block(jen.Add(at).Op("+=").Len(src)),
		jen.If(jen.Len(jen.Id("items")).Op(">").Len(out(buffer)).Op("||").Add(at).Op(">").Len(out(n))).Block(
			jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("errorf").Call(jen.Id("codeInternal"),
				jen.Lit("took %d "+buffer.CName+" with %d "+n.CName+" for room for %d and %d"), jen.Len(jen.Id("items")), at, jen.Len(out(buffer)), jen.Len(out(n)))))),
		jen.Add(at).Op("=").Lit(0),
		jen.For(jen.List(jen.Id("i"), jen.Id("it")).Op(":=").Range().Id("items")).Block(
			out(buffer).Index(jen.Id("i")).Op("=").Id("toC"+d.GoName).Call(jen.Id("it"), out(n).Index(jen.Add(at).Op(":"))),
			jen.Add(at).Op("+=").Len(src)),
		jen.Op("*").Id(buffer.Buffer).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("items"))),
		jen.Op("*").Id(n.Buffer).Op("=").Qual("C", "size_t").Call(at),
		jen.Return(jen.Nil()),
	}
}

// columnFill writes a buffer's Go elements into its columns (column=),
// one caller array per Go field, an array field's elements side by side:
// the count is written first; NULL arrays with capacity 0 ask for it only;
// columns without room for every element are KVCM_ERR_BUFFER_TOO_SMALL,
// writing nothing else.
func columnFill(buffer *Param, columns []*Param, ifErr jen.Code) []jen.Code {
	cols := append([]*Param{buffer}, columns...)
	out := func(p *Param) *jen.Statement { return jen.Id(lowerCamel(p.CName) + "Out") }
	room := func(p *Param) *jen.Statement {
		if p.ColumnWidth == 1 {
			return jen.Id(p.Len)
		}
		return jen.Id(p.Len).Op("*").Lit(int(p.ColumnWidth))
	}
	st := []jen.Code{jen.Op("*").Id(buffer.Buffer).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("items")))}
	var empty, views, small, write []jen.Code
	var names []string
	for i, c := range cols {
		if i > 0 {
			empty = append(empty, jen.Op("&&"))
			small = append(small, jen.Op("||"))
		}
		empty = append(empty, jen.Id(c.CName).Op("==").Nil())
		views = append(views, jen.List(out(c), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id(c.CName), room(c), jen.Lit(c.Len)), ifErr)
		need := jen.Len(jen.Id("items"))
		if c.ColumnWidth != 1 {
			need = need.Op("*").Lit(int(c.ColumnWidth))
		}
		small = append(small, jen.Len(out(c)).Op("<").Add(need))
		names = append(names, c.CName)
		el := goCType(c.Type.Elem)
		if c.ColumnWidth == 1 {
			write = append(write, out(c).Index(jen.Id("i")).Op("=").Add(el).Call(jen.Id("it").Dot(c.Column)))
			continue
		}
		write = append(write, jen.For(jen.List(jen.Id("j"), jen.Id("v")).Op(":=").Range().Id("it").Dot(c.Column)).Block(
			out(c).Index(jen.Id("i").Op("*").Lit(int(c.ColumnWidth)).Op("+").Id("j")).Op("=").Add(el).Call(jen.Id("v"))))
	}
	empty = append(empty, jen.Op("&&").Id(buffer.Len).Op("==").Lit(0))
	st = append(st, jen.If(jen.Add(empty...)).Block(jen.Return(jen.Nil())))
	st = append(st, views...)
	st = append(st, jen.If(jen.Add(small...)).Block(jen.Return(jen.Id("statusOf").Call(jen.Id("kvcmFn"), jen.Id("errorf").Call(
		jen.Id("codeBufferTooSmall"), jen.Lit("need room for %d elements in "+strings.Join(names, ", ")+"; "+buffer.Len+" is %d"),
		jen.Len(jen.Id("items")), jen.Id("uint64").Call(jen.Id(buffer.Len)))))))
	st = append(st, jen.For(jen.List(jen.Id("i"), jen.Id("it")).Op(":=").Range().Id("items")).Block(write...))
	return append(st, jen.Return(jen.Nil()))
}

// goElemCode renders a go= element type: <import path>.<Type>, or a
// predeclared type.
func goElemCode(g string) jen.Code {
	if i := strings.LastIndex(g, "."); i > 0 {
		return jen.Qual(g[:i], g[i+1:])
	}
	return jen.Id(g)
}
