package gen

import (
	"bytes"
	"fmt"
	"go/types"
	"path"
	"strings"

	"github.com/dave/jennifer/jen"
)

func init() { emitters = append(emitters, emitConvert) }

// shimConvert holds the converters between the ABI's structs and the Go
// structs their //kvcm:go directives name (see GoMap), the Go callers of
// vtables with //kvcm:gocaller (see callerArg), and the helpers they use:
// cSlice, cArray, cString and cStringN to read C memory; cBytes, cElems,
// slotError and callBuffer to call slots.
const shimConvert = "convert_generated.go"

func emitConvert(m *Model, p Paths) (map[string][]byte, error) {
	var mapped, callers []*Decl
	for _, d := range m.Decls {
		if d.GoMap != nil {
			mapped = append(mapped, d)
		}
		if d.GoCaller != nil {
			callers = append(callers, d)
		}
	}
	if len(mapped) == 0 && len(callers) == 0 {
		return nil, nil
	}
	f := jen.NewFile(p.ShimPkg)
	f.HeaderComment(Banner)
	f.CgoPreamble(fmt.Sprintf("#include <stdlib.h>\n#include \"%s\"\n#include \"%s\"", p.Include, shimHeader))
	convertHelpers(f)
	if len(callers) > 0 {
		callerHelpers(f)
	}
	for _, d := range mapped {
		if d.GoMap.In {
			f.Add(inConverter(m, d)).Line()
		}
		if d.GoMap.Out {
			f.Add(outConverter(d)).Line()
		}
	}
	for _, d := range copiedDecls(m) {
		f.Add(cCopier(d)).Line()
	}
	for _, d := range callers {
		f.Add(goCaller(m, d)).Line()
		if d.Vtable && d.Versioned {
			f.Add(vtableCheck(m, d)).Line()
		}
	}
	var buf bytes.Buffer
	if err := f.Render(&buf); err != nil {
		return nil, fmt.Errorf("render converters: %w", err)
	}
	return map[string][]byte{path.Join(p.ShimDir, shimConvert): buf.Bytes()}, nil
}

// convertHelpers writes the helpers the converters (and the export glue)
// use to read C memory.
func convertHelpers(f *jen.File) {
	n := func() *jen.Statement { return jen.Id("n") }
	f.Comment("cSlice views a caller's buffer of n elements (nil when p is NULL or n is 0);")
	f.Comment("a count no buffer can hold is an error naming name.")
	f.Func().Id("cSlice").Types(jen.Id("T").Any()).Params(jen.Id("p").Op("*").Id("T"), n().Qual("C", "size_t"), jen.Id("name").String()).
		Params(jen.Index().Id("T"), jen.Error()).Block(
		jen.If(n().Op(">").Qual("github.com/kvcm/kvcm/core/abimodel", "MaxElems").Op("/").Qual("C", "size_t").Call(
			jen.Id("max").Call(jen.Qual("unsafe", "Sizeof").Call(jen.Op("*").Id("p")), jen.Lit(1)))).Block(
			jen.Return(jen.Nil(), jen.Id("argError").Call(jen.Id("name"), jen.Lit("%d is too large"), jen.Uint64().Call(n())))),
		jen.If(jen.Id("p").Op("==").Nil().Op("||").Add(n()).Op("==").Lit(0)).Block(jen.Return(jen.Nil(), jen.Nil())),
		jen.Return(jen.Qual("unsafe", "Slice").Call(jen.Id("p"), jen.Int().Call(n())), jen.Nil()),
	)
	f.Line()
	f.Comment("cArray views a borrowed input array of n elements: NULL with n > 0, or")
	f.Comment("more than abimodel.MaxInputBytes bytes (which the library would copy), is")
	f.Comment("an error naming name.")
	f.Func().Id("cArray").Types(jen.Id("T").Any()).Params(jen.Id("p").Op("*").Id("T"), n().Qual("C", "size_t"), jen.Id("name").String()).
		Params(jen.Index().Id("T"), jen.Error()).Block(
		jen.If(jen.Id("p").Op("==").Nil().Op("&&").Add(n()).Op("!=").Lit(0)).Block(
			jen.Return(jen.Nil(), jen.Id("argError").Call(jen.Id("name"), jen.Lit("is NULL but its length is %d"), jen.Uint64().Call(n())))),
		jen.If(n().Op(">").Qual("github.com/kvcm/kvcm/core/abimodel", "MaxInputBytes").Op("/").Qual("C", "size_t").Call(
			jen.Id("max").Call(jen.Qual("unsafe", "Sizeof").Call(jen.Op("*").Id("p")), jen.Lit(1)))).Block(
			jen.Return(jen.Nil(), jen.Id("argError").Call(jen.Id("name"), jen.Lit("%d is too large"), jen.Uint64().Call(n())))),
		jen.Return(jen.Id("cSlice").Call(jen.Id("p"), n(), jen.Id("name"))),
	)
	f.Line()
	f.Comment("cStructsArg converts the n structs at p (a borrowed input array) by conv,")
	f.Comment("each named name[i] in its errors; nil for none.")
	f.Func().Id("cStructsArg").Types(jen.List(jen.Id("T"), jen.Id("G")).Any()).Params(jen.Id("p").Op("*").Id("T"), n().Qual("C", "size_t"), jen.Id("name").String(),
		jen.Id("conv").Func().Params(jen.Op("*").Id("T"), jen.String()).Params(jen.Id("G"), jen.Error())).
		Params(jen.Index().Id("G"), jen.Error()).Block(
		jen.List(jen.Id("cs"), jen.Err()).Op(":=").Id("cArray").Call(jen.Id("p"), n(), jen.Id("name")),
		jen.If(jen.Err().Op("!=").Nil().Op("||").Len(jen.Id("cs")).Op("==").Lit(0)).Block(jen.Return(jen.Nil(), jen.Err())),
		jen.Id("out").Op(":=").Make(jen.Index().Id("G"), jen.Len(jen.Id("cs"))),
		jen.For(jen.Id("i").Op(":=").Range().Id("cs")).Block(
			jen.If(jen.List(jen.Id("out").Index(jen.Id("i")), jen.Err()).Op("=").Id("conv").Call(jen.Op("&").Id("cs").Index(jen.Id("i")),
				jen.Qual("fmt", "Sprintf").Call(jen.Lit("%s[%d]"), jen.Id("name"), jen.Id("i"))), jen.Err().Op("!=").Nil()).Block(
				jen.Return(jen.Nil(), jen.Err()))),
		jen.Return(jen.Id("out"), jen.Nil()),
	)
	f.Line()
	f.Comment("cStringArg copies the n bytes at p (a parameter the export checked), whose")
	f.Comment("length is the parameter lenName.")
	f.Func().Id("cStringArg").Params(jen.Id("p").Op("*").Qual("C", "char"), n().Qual("C", "size_t"), jen.Id("lenName").String()).
		Params(jen.String(), jen.Error()).Block(
		jen.If(n().Op(">").Qual("github.com/kvcm/kvcm/core/abimodel", "MaxInputBytes")).Block(
			jen.Return(jen.Lit(""), jen.Id("argError").Call(jen.Id("lenName"), jen.Lit("%d is too large"), jen.Uint64().Call(n())))),
		jen.If(n().Op("==").Lit(0).Op("||").Id("p").Op("==").Nil()).Block(jen.Return(jen.Lit(""), jen.Nil())),
		jen.Return(jen.Qual("C", "GoStringN").Call(jen.Id("p"), jen.Qual("C", "int").Call(n())), jen.Nil()),
	)
	f.Line()
	f.Comment("number is the element types cSliceArg converts between.")
	var kinds []jen.Code
	for _, k := range []string{"int8", "int16", "int32", "int64", "int", "uint8", "uint16", "uint32", "uint64", "uint", "uintptr", "float32", "float64"} {
		kinds = append(kinds, jen.Op("~").Id(k))
	}
	f.Type().Id("number").Interface(jen.Union(kinds...))
	f.Line()
	f.Comment("fieldPresent reports whether a versioned struct of structSize bytes (its")
	f.Comment("struct_size) holds the field at offset of size bytes: a field appended")
	f.Comment("after the struct's first version is read only then. Tested in Go, not by a")
	f.Comment("call into C per field, which costs more than the field's conversion.")
	f.Func().Id("fieldPresent").Params(jen.Id("structSize").Qual("C", "uint32_t"), jen.List(jen.Id("offset"), jen.Id("size")).Uintptr()).Bool().Block(
		jen.Return(jen.Uintptr().Call(jen.Id("structSize")).Op(">=").Id("offset").Op("+").Id("size")),
	)
	f.Line()
	f.Comment("convertNumbers writes the elements of es, converted to G, into out (of")
	f.Comment("their length): in one copy when G and E are integers of one width, whose")
	f.Comment("conversion keeps the bits (a prompt's tokens: a memmove, not a loop).")
	f.Func().Id("convertNumbers").Types(jen.Id("G"), jen.Id("E").Id("number")).Params(jen.Id("out").Index().Id("G"), jen.Id("es").Index().Id("E")).Block(
		jen.If(jen.Qual("unsafe", "Sizeof").Call(jen.Id("out").Index(jen.Lit(0))).Op("==").Qual("unsafe", "Sizeof").Call(jen.Id("es").Index(jen.Lit(0))).
			Op("&&").Id("G").Call(jen.Lit(1)).Op("/").Lit(2).Op("==").Lit(0).Op("&&").Id("E").Call(jen.Lit(1)).Op("/").Lit(2).Op("==").Lit(0)).Block(
			jen.Copy(jen.Id("out"), jen.Qual("unsafe", "Slice").Call(
				jen.Parens(jen.Op("*").Id("G")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Qual("unsafe", "SliceData").Call(jen.Id("es")))), jen.Len(jen.Id("es")))),
			jen.Return(),
		),
		jen.For(jen.List(jen.Id("i"), jen.Id("e")).Op(":=").Range().Id("es")).Block(jen.Id("out").Index(jen.Id("i")).Op("=").Id("G").Call(jen.Id("e"))),
	)
	f.Line()
	f.Comment("cSliceArg copies the n elements at p, converted to G (nil for none),")
	f.Comment("into buf when they fit: the export of a short slice parameter passes")
	f.Comment("an array of its frame, which stays on the stack (its glue keeps no")
	f.Comment("slice), so a decode step's one token costs no allocation.")
	f.Func().Id("cSliceArg").Types(jen.Id("G"), jen.Id("E").Id("number")).Params(jen.Id("buf").Index().Id("G"), jen.Id("p").Op("*").Id("E"), n().Qual("C", "size_t"), jen.Id("name").String()).
		Params(jen.Index().Id("G"), jen.Error()).Block(
		jen.List(jen.Id("es"), jen.Err()).Op(":=").Id("cArray").Call(jen.Id("p"), n(), jen.Id("name")),
		jen.If(jen.Err().Op("!=").Nil().Op("||").Len(jen.Id("es")).Op("==").Lit(0)).Block(jen.Return(jen.Nil(), jen.Err())),
		jen.Var().Id("out").Index().Id("G"),
		jen.If(jen.Len(jen.Id("es")).Op("<=").Cap(jen.Id("buf"))).Block(
			jen.Id("out").Op("=").Id("buf").Index(jen.Op(":").Len(jen.Id("es"))),
		).Else().Block(
			jen.Id("out").Op("=").Make(jen.Index().Id("G"), jen.Len(jen.Id("es"))),
		),
		jen.Id("convertNumbers").Call(jen.Id("out"), jen.Id("es")),
		jen.Return(jen.Id("out"), jen.Nil()),
	)
	f.Line()
	f.Comment("cSliceArgNil is cSliceArg keeping NULL apart from an empty array: NULL")
	f.Comment("is nil, a non-NULL array of 0 elements an empty slice.")
	f.Func().Id("cSliceArgNil").Types(jen.Id("G"), jen.Id("E").Id("number")).Params(jen.Id("buf").Index().Id("G"), jen.Id("p").Op("*").Id("E"), n().Qual("C", "size_t"), jen.Id("name").String()).
		Params(jen.Index().Id("G"), jen.Error()).Block(
		jen.List(jen.Id("out"), jen.Err()).Op(":=").Id("cSliceArg").Call(jen.Id("buf"), jen.Id("p"), n(), jen.Id("name")),
		jen.If(jen.Err().Op("==").Nil().Op("&&").Id("out").Op("==").Nil().Op("&&").Id("p").Op("!=").Nil()).Block(jen.Id("out").Op("=").Index().Id("G").Values()),
		jen.Return(jen.Id("out"), jen.Err()),
	)
	f.Line()
	f.Comment("fill writes items into a caller's buffer of capacity elements, converted")
	f.Comment("by conv, and their number to needed; a NULL buffer with capacity 0 asks")
	f.Comment("for the number only, a smaller one is KVCM_ERR_BUFFER_TOO_SMALL.")
	f.Func().Id("fill").Types(jen.List(jen.Id("T"), jen.Id("E")).Any()).Params(jen.Id("items").Index().Id("T"), jen.Id("buf").Op("*").Id("E"),
		jen.Id("capacity").Qual("C", "size_t"), jen.Id("needed").Op("*").Qual("C", "size_t"), jen.Id("conv").Func().Params(jen.Id("T")).Id("E")).Error().Block(
		jen.Return(jen.Id("fillTaken").Call(jen.Id("items"), jen.Len(jen.Id("items")), jen.Id("buf"), jen.Id("capacity"), jen.Id("needed"), jen.Id("conv"))),
	)
	f.Line()
	f.Comment("fillTaken is fill for a get-and-reset query of n entries: items are")
	f.Comment("those it took, none when the buffer cannot hold n (nothing was reset).")
	f.Func().Id("fillTaken").Types(jen.List(jen.Id("T"), jen.Id("E")).Any()).Params(jen.Id("items").Index().Id("T"), n().Int(), jen.Id("buf").Op("*").Id("E"),
		jen.Id("capacity").Qual("C", "size_t"), jen.Id("needed").Op("*").Qual("C", "size_t"), jen.Id("conv").Func().Params(jen.Id("T")).Id("E")).Error().Block(
		jen.Op("*").Id("needed").Op("=").Qual("C", "size_t").Call(n()),
		jen.If(jen.Id("buf").Op("==").Nil().Op("&&").Id("capacity").Op("==").Lit(0)).Block(jen.Return(jen.Nil())),
		jen.List(jen.Id("out"), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id("buf"), jen.Id("capacity"), jen.Lit("capacity")),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Err())),
		jen.If(jen.Uint64().Call(jen.Id("capacity")).Op("<").Uint64().Call(n()).Op("||").Len(jen.Id("items")).Op(">").Len(jen.Id("out"))).Block(
			jen.Return(jen.Id("errorf").Call(jen.Id("codeBufferTooSmall"), jen.Lit("need room for %d entries, got %d"), n(), jen.Uint64().Call(jen.Id("capacity"))))),
		jen.For(jen.List(jen.Id("i"), jen.Id("it")).Op(":=").Range().Id("items")).Block(jen.Id("out").Index(jen.Id("i")).Op("=").Id("conv").Call(jen.Id("it"))),
		jen.Return(jen.Nil()),
	)
	f.Line()
	f.Comment("fillSized writes items into a caller's buffer whose length is the input")
	f.Comment("count name (n elements), converted by conv; more items than that is an")
	f.Comment("internal error.")
	f.Func().Id("fillSized").Types(jen.List(jen.Id("T"), jen.Id("E")).Any()).Params(jen.Id("items").Index().Id("T"), jen.Id("buf").Op("*").Id("E"),
		n().Qual("C", "size_t"), jen.Id("name").String(), jen.Id("conv").Func().Params(jen.Id("T")).Id("E")).Error().Block(
		jen.List(jen.Id("out"), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id("buf"), n(), jen.Id("name")),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Err())),
		jen.If(jen.Len(jen.Id("items")).Op(">").Len(jen.Id("out"))).Block(
			jen.Return(jen.Id("errorf").Call(jen.Id("codeInternal"), jen.Lit("%d entries for the %d of %s"), jen.Len(jen.Id("items")), jen.Len(jen.Id("out")), jen.Id("name")))),
		jen.For(jen.List(jen.Id("i"), jen.Id("it")).Op(":=").Range().Id("items")).Block(jen.Id("out").Index(jen.Id("i")).Op("=").Id("conv").Call(jen.Id("it"))),
		jen.Return(jen.Nil()),
	)
	f.Line()
	f.Comment("bufferRoom is how many entries a caller's buffer holds (0 for a size")
	f.Comment("query), for a get-and-reset query that takes only what fits.")
	f.Func().Id("bufferRoom").Types(jen.Id("E").Any()).Params(jen.Id("buf").Op("*").Id("E"), jen.Id("capacity").Qual("C", "size_t")).Params(jen.Int(), jen.Error()).Block(
		jen.List(jen.Id("out"), jen.Err()).Op(":=").Id("cSlice").Call(jen.Id("buf"), jen.Id("capacity"), jen.Lit("capacity")),
		jen.Return(jen.Len(jen.Id("out")), jen.Err()),
	)
	f.Line()
	f.Comment("cString copies a NUL-terminated string; NULL is \"\".")
	f.Func().Id("cString").Params(jen.Id("p").Op("*").Qual("C", "char")).String().Block(
		jen.If(jen.Id("p").Op("==").Nil()).Block(jen.Return(jen.Lit(""))),
		jen.Return(jen.Qual("C", "GoString").Call(jen.Id("p"))),
	)
	f.Line()
	f.Comment("cStringN copies the n bytes at p (NUL bytes included), field of the struct")
	f.Comment("name with its length in lenField: NULL is \"\" only when n is 0.")
	f.Func().Id("cStringN").Params(jen.Id("p").Op("*").Qual("C", "char"), n().Qual("C", "size_t"), jen.List(jen.Id("name"), jen.Id("field"), jen.Id("lenField")).String()).
		Params(jen.String(), jen.Error()).Block(
		jen.If(jen.Id("p").Op("==").Nil().Op("&&").Add(n()).Op("!=").Lit(0)).Block(
			jen.Return(jen.Lit(""), jen.Id("argError").Call(jen.Id("name").Op("+").Lit(".").Op("+").Id("field"),
				jen.Lit("is NULL but ").Op("+").Id("lenField").Op("+").Lit(" is %d"), jen.Uint64().Call(n())))),
		jen.If(n().Op(">").Lit(1<<30)).Block(
			jen.Return(jen.Lit(""), jen.Id("argError").Call(jen.Id("name").Op("+").Lit(".").Op("+").Id("lenField"),
				jen.Lit("%d is too large"), jen.Uint64().Call(n())))),
		jen.If(n().Op("==").Lit(0)).Block(jen.Return(jen.Lit(""), jen.Nil())),
		jen.Return(jen.Qual("C", "GoStringN").Call(jen.Id("p"), jen.Qual("C", "int").Call(n())), jen.Nil()),
	)
	f.Line()
}

// goTypeCode renders a Go type of the core.
func goTypeCode(t types.Type) jen.Code {
	switch t := t.(type) {
	case *types.Named:
		if t.Obj().Pkg() == nil { // error
			return jen.Id(t.Obj().Name())
		}
		return jen.Qual(t.Obj().Pkg().Path(), t.Obj().Name())
	case *types.Alias:
		if t.Obj().Pkg() == nil {
			return jen.Id(t.Obj().Name())
		}
		return jen.Qual(t.Obj().Pkg().Path(), t.Obj().Name())
	case *types.Basic:
		return jen.Id(t.Name())
	case *types.Slice:
		return jen.Index().Add(goTypeCode(t.Elem()))
	case *types.Pointer:
		return jen.Op("*").Add(goTypeCode(t.Elem()))
	}
	panic(fmt.Sprintf("gen: no Go type code for %s", t))
}

func goMapType(g *GoMap) jen.Code { return jen.Qual(g.Path, g.Name) }

// elemValue converts the C element val at ptr (a *C.T expression) to the
// Go type t, as statements ending in v := ...; struct elements go through
// their in converter, named by nameExpr.
func elemValue(el *Type, t types.Type, val, ptr, nameExpr jen.Code) []jen.Code {
	if el.Kind == KNamed && el.Decl.Kind == DStruct {
		return []jen.Code{
			jen.List(jen.Id("v"), jen.Err()).Op(":=").Id("fromC"+el.Decl.GoName).Call(ptr, nameExpr),
			jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("out"), jen.Err())),
		}
	}
	return []jen.Code{jen.Id("v").Op(":=").Add(castTo(t, val))}
}

// numberPair reports whether the C element type c and the Go element type g
// are both numbers (not bool), which convertNumbers converts.
func numberPair(c *Type, g types.Type) bool {
	if c.Kind == KNamed && c.Decl.Kind == DTypedef {
		c = c.Decl.Base
	}
	if c.Kind != KScalar && c.Kind != KSize || c.Scalar == "bool" {
		return false
	}
	b, ok := g.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsNumeric != 0 && b.Info()&types.IsComplex == 0
}

// castTo converts the expression x to the Go type t (no conversion to a
// plain string, which x already is).
func castTo(t types.Type, x jen.Code) jen.Code {
	if types.Identical(t, types.Typ[types.String]) {
		return x
	}
	return jen.Add(goTypeCode(t)).Call(x)
}

// wrapsSigned reports whether the C scalar c (uint64_t or size_t) holds
// values the Go type t (a 64-bit signed integer) cannot.
func wrapsSigned(c *Type, t types.Type) bool {
	if c.Kind != KSize && (c.Kind != KScalar || c.Scalar != "uint64_t") {
		return false
	}
	b, ok := t.Underlying().(*types.Basic)
	return ok && (b.Kind() == types.Int64 || b.Kind() == types.Int)
}

// inConverter writes fromC<Decl>.
func inConverter(m *Model, d *Decl) jen.Code {
	g := d.GoMap
	var body []jen.Code
	body = append(body, jen.Var().Id("out").Add(goMapType(g)))
	fail := func(field, msg string) jen.Code {
		return jen.Return(jen.Id("out"), jen.Id("argError").Call(jen.Id("name").Op("+").Lit("."+field), jen.Lit(msg)))
	}
	for _, f := range MappedFields(d) {
		t, _ := goTarget(d, f)
		dst := jen.Id("out").Dot(f.GoField())
		src := func() *jen.Statement { return jen.Id("c").Dot(f.CName) }
		var st []jen.Code
		switch {
		case isScalarField(f.Type) && wrapsSigned(f.Type, t):
			// A value the signed Go field cannot hold would turn negative.
			st = append(st, jen.If(jen.Uint64().Call(src()).Op(">").Qual("math", "MaxInt64")).Block(fail(f.CName, "is too large")),
				dst.Op("=").Add(goTypeCode(t)).Call(src()))
		case isScalarField(f.Type):
			st = append(st, dst.Op("=").Add(goTypeCode(t)).Call(src()))
		case f.Type.Kind == KNamed && f.Type.Decl.Kind == DCallback:
			st = append(st, dst.Op("=").Id("goCaller"+f.Type.Decl.GoName).Call(src(), jen.Op("*").Parens(jen.Op("*").Qual("C", "uintptr_t")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Op("&").Id("c").Dot(f.User)))))
		case f.Type.Kind == KCStr && f.Len != "":
			st = append(st, jen.Block(
				jen.List(jen.Id("s"), jen.Err()).Op(":=").Id("cStringN").Call(src(), jen.Id("c").Dot(f.Len), jen.Id("name"), jen.Lit(f.CName), jen.Lit(f.Len)),
				jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("out"), jen.Err())),
				jen.Id("out").Dot(f.GoField()).Op("=").Add(castTo(t, jen.Id("s")))))
		case f.Type.Kind == KCStr && f.Nullable:
			st = append(st, dst.Op("=").Add(castTo(t, jen.Id("cString").Call(src()))))
		case f.Type.Kind == KCStr:
			st = append(st,
				jen.If(src().Op("==").Nil()).Block(fail(f.CName, "is NULL")),
				dst.Op("=").Add(castTo(t, jen.Qual("C", "GoString").Call(src()))))
		case f.Type.Kind == KPtr && f.Len != "" && numberPair(f.Type.Elem, t.Underlying().(*types.Slice).Elem()):
			// One make and one convertNumbers, nil exactly as below.
			present := jen.Len(jen.Id("s")).Op(">").Lit(0)
			if f.Nullable {
				present = src().Op("!=").Nil()
			}
			st = append(st, jen.Block(
				jen.List(jen.Id("s"), jen.Err()).Op(":=").Id("cArray").Call(src(), jen.Id("c").Dot(f.Len), jen.Id("name").Op("+").Lit("."+f.CName)),
				jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("out"), jen.Err())),
				jen.If(present).Block(
					dst.Clone().Op("=").Make(goTypeCode(t), jen.Len(jen.Id("s"))),
					jen.Id("convertNumbers").Call(dst.Clone(), jen.Id("s"))),
			))
		case f.Type.Kind == KPtr && f.Len != "":
			elem := t.Underlying().(*types.Slice).Elem()
			loop := append(elemValue(f.Type.Elem, elem, jen.Id("s").Index(jen.Id("i")), jen.Op("&").Id("s").Index(jen.Id("i")),
				jen.Qual("fmt", "Sprintf").Call(jen.Lit("%s."+f.CName+"[%d]"), jen.Id("name"), jen.Id("i"))),
				jen.Id("out").Dot(f.GoField()).Op("=").Append(jen.Id("out").Dot(f.GoField()), jen.Id("v")))
			arr := []jen.Code{
				jen.List(jen.Id("s"), jen.Err()).Op(":=").Id("cArray").Call(src(), jen.Id("c").Dot(f.Len), jen.Id("name").Op("+").Lit("."+f.CName)),
				jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Id("out"), jen.Err())),
			}
			if f.Nullable { // nil exactly when NULL: a non-NULL empty array is set
				arr = append(arr, jen.If(src().Op("!=").Nil()).Block(
					jen.Id("out").Dot(f.GoField()).Op("=").Make(goTypeCode(t), jen.Lit(0), jen.Len(jen.Id("s")))))
			}
			arr = append(arr, jen.For(jen.Id("i").Op(":=").Range().Id("s")).Block(loop...))
			st = append(st, jen.Block(arr...))
		case f.Type.Kind == KPtr:
			elem := t.Underlying().(*types.Pointer).Elem()
			set := append(elemValue(f.Type.Elem, elem, jen.Op("*").Add(src()), src(), jen.Id("name").Op("+").Lit("."+f.CName)),
				jen.Id("out").Dot(f.GoField()).Op("=").Op("&").Id("v"))
			if !f.Nullable {
				st = append(st, jen.If(src().Op("==").Nil()).Block(fail(f.CName, "is NULL")))
			}
			st = append(st, jen.If(src().Op("!=").Nil()).Block(set...))
		default: // a struct by value
			set := append(elemValue(f.Type, t, src(), jen.Op("&").Add(src()), jen.Id("name").Op("+").Lit("."+f.CName)),
				jen.Id("out").Dot(f.GoField()).Op("=").Id("v"))
			st = append(st, jen.Block(set...))
		}
		if d.Versioned && f.Since > d.Since {
			field := jen.Id("c").Dot(f.CName)
			covers := jen.Id("fieldPresent").Call(jen.Id("c").Dot("struct_size"),
				jen.Qual("unsafe", "Offsetof").Call(field), jen.Qual("unsafe", "Sizeof").Call(field.Clone()))
			st = []jen.Code{jen.If(covers).Block(st...)}
		}
		body = append(body, st...)
	}
	body = append(body, jen.Return(jen.Id("out"), jen.Nil()))
	name := "fromC" + d.GoName
	return jen.Comment(fmt.Sprintf("%s converts a %s to a %s.%s; name names it in errors.", name, d.CName, path.Base(g.Path), g.Name)).Line().
		Func().Id(name).Params(jen.Id("c").Op("*").Qual("C", d.CName), jen.Id("name").String()).Params(goMapType(g), jen.Error()).Block(body...)
}

// outConverter writes toC<Decl>. A struct with arrays (a len tag) gets
// one more parameter per array, named after its field: the caller's nested
// buffer, with room for the elements, which the converter writes there and
// points the field at (NULL for none).
func outConverter(d *Decl) jen.Code {
	g := d.GoMap
	dict := jen.Dict{}
	params := []jen.Code{jen.Id("s").Add(goMapType(g))}
	var arrays []jen.Code
	for _, f := range MappedFields(d) {
		src := jen.Id("s")
		for _, name := range strings.Split(strings.TrimSuffix(f.GoField(), "()"), ".") {
			src = src.Dot(name)
		}
		if strings.HasSuffix(f.GoField(), "()") {
			src = src.Call()
		}
		if isOutArray(f) {
			el := f.Type.Elem
			params = append(params, jen.Id(f.CName).Index().Add(goCType(el)))
			dict[jen.Id(f.Len)] = jen.Qual("C", "size_t").Call(jen.Len(src))
			var v jen.Code = jen.Add(goCType(el)).Call(jen.Id("v"))
			if el.Kind == KNamed && el.Decl.Kind == DStruct {
				v = jen.Id("toC" + el.Decl.GoName).Call(jen.Id("v"))
			}
			arrays = append(arrays,
				jen.If(jen.Len(src).Op(">").Lit(0)).Block(jen.Id("c").Dot(f.CName).Op("=").Op("&").Id(f.CName).Index(jen.Lit(0))),
				jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Add(src)).Block(jen.Id(f.CName).Index(jen.Id("i")).Op("=").Add(v)))
			continue
		}
		dict[jen.Id(f.CName)] = jen.Add(goCType(f.Type)).Call(src)
	}
	name := "toC" + d.GoName
	doc := jen.Comment(fmt.Sprintf("%s converts a %s.%s to a %s.", name, path.Base(g.Path), g.Name, d.CName))
	if len(arrays) == 0 {
		return doc.Line().Func().Id(name).Params(params...).Qual("C", d.CName).Block(
			jen.Return(jen.Qual("C", d.CName).Values(dict)))
	}
	doc = doc.Line().Comment("Its arrays go to the start of the buffers of their names, which have room.")
	body := append([]jen.Code{jen.Id("c").Op(":=").Qual("C", d.CName).Values(dict)}, arrays...)
	body = append(body, jen.Return(jen.Id("c")))
	return doc.Line().Func().Id(name).Params(params...).Qual("C", d.CName).Block(body...)
}
