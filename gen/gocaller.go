package gen

import (
	"fmt"
	"go/types"
	"strings"

	"github.com/dave/jennifer/jen"
)

// A vtable with //kvcm:gocaller <import path>.<Type> names a Go struct of
// funcs (such as core/cp.External) that calls the vtable: kvcmgen writes
// goCaller<Decl>(vt, self) <Type>, which sets the func field of the slot's
// name for every slot present (struct_size covers it and it is non-null).
// Slots tagged go:"-" are left to the export glue. The parameters after self
// map to the Go func's by their convention:
//
//   - const char* p, size_t pLen: a string, copied into C memory for the
//     call (NULL for "");
//   - const T* p, size_t n (T a scalar): a []G whose elements have T's size,
//     passed in place (NULL when empty);
//   - T* p, size_t capacity, size_t* needed (T a scalar): a []G result,
//     asked for with 64 elements and once more with the needed count;
//   - T* p (T a scalar): a G result;
//   - a scalar: a G parameter, cast.
//
// An int32_t slot result is the func's last result, an error when not 0
// ("<slot> returned <rc>").
type callerArg struct {
	kind  string // string, slice, buffer, out, value
	param *Param // the first C parameter it stands for
}

// callerArgs classifies a slot's parameters after self into the Go func's
// parameters and results.
func callerArgs(slot *Field) (params, results []callerArg, err error) {
	ps := slot.Type.Sig.Params
	if len(ps) == 0 || ps[0].Type.Kind != KVoidPtr {
		return nil, nil, fmt.Errorf("slot %s does not take self first", slot.CName)
	}
	at := func(i int) *Type {
		if i < len(ps) {
			return ps[i].Type
		}
		return &Type{Kind: KVoid}
	}
	for i := 1; i < len(ps); {
		t := at(i)
		out := t.Kind == KPtr && t.Dir == DirOut && isScalarField(t.Elem)
		switch {
		case t.Kind == KCStr && ps[i].Len != "":
			params, i = append(params, callerArg{"string", ps[i]}), i+2
		case t.Kind == KPtr && t.Dir == DirIn && isScalarField(t.Elem) && at(i+1).Kind == KSize:
			params, i = append(params, callerArg{"slice", ps[i]}), i+2
		case out && at(i+1).Kind == KSize && at(i+2).Kind == KPtr && at(i+2).Dir == DirOut && at(i+2).Elem.Kind == KSize:
			results, i = append(results, callerArg{"buffer", ps[i]}), i+3
		case out:
			results, i = append(results, callerArg{"out", ps[i]}), i+1
		case isScalarField(t):
			params, i = append(params, callerArg{"value", ps[i]}), i+1
		default:
			return nil, nil, fmt.Errorf("slot %s: parameter %s follows no convention of //kvcm:gocaller: tag the slot go:\"-\"", slot.CName, ps[i].CName)
		}
	}
	if len(results) > 1 {
		return nil, nil, fmt.Errorf("slot %s: a Go caller has at most one result besides its error", slot.CName)
	}
	return params, results, nil
}

// callerSlots are the slots of a //kvcm:gocaller vtable that it calls.
func callerSlots(d *Decl) []*Field {
	var out []*Field
	for _, f := range goImplSlots(d) {
		if f.Go != "-" {
			out = append(out, f)
		}
	}
	return out
}

// checkCaller checks that every called slot's Go func has the signature its
// conventions give.
func checkCaller(d *Decl) error {
	g := d.GoCaller
	st := g.Type.Underlying().(*types.Struct)
	for _, f := range callerSlots(d) {
		where := fmt.Sprintf("%s.%s (//kvcm:gocaller %s.%s)", d.GoName, f.GoName, g.Path, g.Name)
		var fn *types.Signature
		for i := range st.NumFields() {
			if st.Field(i).Name() == f.GoField() {
				fn, _ = st.Field(i).Type().(*types.Signature)
			}
		}
		if fn == nil {
			return fmt.Errorf("%s: %s has no func field %s: name it with a go:\"Field\" tag, or tag the slot go:\"-\"", where, g.Name, f.GoField())
		}
		params, results, err := callerArgs(f)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		rc := f.Type.Sig.Result.Kind == KScalar && f.Type.Sig.Result.Scalar == "int32_t"
		nres := len(results)
		if rc {
			nres++
		}
		if fn.Params().Len() != len(params) || fn.Results().Len() != nres {
			return fmt.Errorf("%s: want %d parameters and %d results, the func field has %d and %d", where, len(params), nres, fn.Params().Len(), fn.Results().Len())
		}
		for i, a := range params {
			if !callerTypeOK(a, fn.Params().At(i).Type()) {
				return fmt.Errorf("%s: parameter %d (%s, a %s) cannot be %s", where, i, a.param.CName, a.kind, fn.Params().At(i).Type())
			}
		}
		for i, a := range results {
			if !callerTypeOK(a, fn.Results().At(i).Type()) {
				return fmt.Errorf("%s: result %d (%s, a %s) cannot be %s", where, i, a.param.CName, a.kind, fn.Results().At(i).Type())
			}
		}
		if rc && !types.Identical(fn.Results().At(nres-1).Type(), types.Universe.Lookup("error").Type()) {
			return fmt.Errorf("%s: the int32_t result maps to a last result of type error", where)
		}
	}
	return nil
}

var goSizes = types.SizesFor("gc", "amd64")

func isNumeric(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsNumeric != 0
}

// callerTypeOK reports whether the Go type t fits the argument's convention.
func callerTypeOK(a callerArg, t types.Type) bool {
	switch a.kind {
	case "string":
		b, ok := t.Underlying().(*types.Basic)
		return ok && b.Info()&types.IsString != 0
	case "slice", "buffer":
		s, ok := t.Underlying().(*types.Slice)
		size, _ := a.param.Type.Elem.sizeAlign()
		return ok && isNumeric(s.Elem()) && goSizes.Sizeof(s.Elem()) == int64(size)
	}
	return isNumeric(t)
}

// callerHelpers writes the helpers the Go callers use.
func callerHelpers(f *jen.File) {
	size := func() *jen.Statement { return jen.Qual("C", "size_t") }
	f.Comment("cBytes copies s into C memory for one call (NULL for \"\"); free releases it.")
	f.Func().Id("cBytes").Params(jen.Id("s").String()).Params(jen.Op("*").Qual("C", "char"), size(), jen.Func().Params()).Block(
		jen.If(jen.Id("s").Op("==").Lit("")).Block(jen.Return(jen.Nil(), jen.Lit(0), jen.Func().Params().Block())),
		jen.Id("p").Op(":=").Qual("C", "CString").Call(jen.Id("s")),
		jen.Return(jen.Id("p"), size().Call(jen.Len(jen.Id("s"))), jen.Func().Params().Block(
			jen.Qual("C", "free").Call(jen.Qual("unsafe", "Pointer").Call(jen.Id("p"))))),
	)
	f.Line()
	f.Comment("cElems passes the elements of s in place (NULL when empty): E and G have one")
	f.Comment("size and hold no pointers, so cgo pins s for the call.")
	f.Func().Id("cElems").Types(jen.List(jen.Id("E"), jen.Id("G")).Any()).Params(jen.Id("s").Index().Id("G")).Op("*").Id("E").Block(
		jen.If(jen.Len(jen.Id("s")).Op("==").Lit(0)).Block(jen.Return(jen.Nil())),
		jen.Return(jen.Parens(jen.Op("*").Id("E")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Op("&").Id("s").Index(jen.Lit(0))))),
	)
	f.Line()
	f.Comment("slotError is the error of a slot that returned rc.")
	f.Func().Id("slotError").Params(jen.Id("slot").String(), jen.Id("rc").Qual("C", "int32_t")).Error().Block(
		jen.If(jen.Id("rc").Op("==").Lit(0)).Block(jen.Return(jen.Nil())),
		jen.Return(jen.Qual("fmt", "Errorf").Call(jen.Lit("%s returned %d"), jen.Id("slot"), jen.Int32().Call(jen.Id("rc")))),
	)
	f.Line()
	f.Comment("callBuffer calls a slot that fills a buffer and reports the elements it")
	f.Comment("needed: with room for 64, then once more with the room it asked for.")
	buf := func() *jen.Statement { return jen.Id("buf") }
	f.Func().Id("callBuffer").Types(jen.List(jen.Id("G"), jen.Id("E")).Any()).Params(jen.Id("slot").String(),
		jen.Id("call").Func().Params(jen.Op("*").Id("E"), size(), jen.Op("*").Add(size())).Qual("C", "int32_t")).
		Params(jen.Index().Id("G"), jen.Error()).Block(
		buf().Op(":=").Make(jen.Index().Id("G"), jen.Lit(64)),
		jen.For(jen.Range().Lit(2)).Block(
			jen.Var().Id("needed").Add(size()),
			jen.Id("rc").Op(":=").Id("call").Call(jen.Parens(jen.Op("*").Id("E")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Op("&").Add(buf()).Index(jen.Lit(0)))),
				size().Call(jen.Len(buf())), jen.Op("&").Id("needed")),
			jen.If(jen.Err().Op(":=").Id("slotError").Call(jen.Id("slot"), jen.Id("rc")), jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Nil(), jen.Err())),
			jen.If(jen.Uint64().Call(jen.Id("needed")).Op("<=").Uint64().Call(jen.Len(buf()))).Block(jen.Return(buf().Index(jen.Empty(), jen.Id("needed")), jen.Nil())),
			jen.If(jen.Id("needed").Op(">").Qual("github.com/kvcm/kvcm/core/abimodel", "MaxElems").Op("/").Add(size()).Call(jen.Qual("unsafe", "Sizeof").Call(buf().Index(jen.Lit(0))))).Block(
				jen.Return(jen.Nil(), jen.Qual("fmt", "Errorf").Call(jen.Lit("%s needs %d elements"), jen.Id("slot"), jen.Uint64().Call(jen.Id("needed"))))),
			buf().Op("=").Make(jen.Index().Id("G"), jen.Id("needed")),
		),
		jen.Return(jen.Nil(), jen.Qual("fmt", "Errorf").Call(jen.Lit("%s needed more than the %d elements it asked for"), jen.Id("slot"), jen.Len(buf()))),
	)
	f.Line()
}

// goCaller writes goCaller<Decl>.
func goCaller(m *Model, d *Decl) jen.Code {
	g := d.GoCaller
	short := strings.TrimPrefix(d.CName, m.Prefix+"_")
	st := g.Type.Underlying().(*types.Struct)
	fieldType := func(name string) *types.Signature {
		for i := range st.NumFields() {
			if st.Field(i).Name() == name {
				return st.Field(i).Type().(*types.Signature)
			}
		}
		return nil
	}
	body := []jen.Code{jen.Var().Id("out").Add(goMapType(g))}
	for _, f := range callerSlots(d) {
		fn := fieldType(f.GoField())
		params, results, _ := callerArgs(f)
		var gparams, gresults []jen.Code
		var pre []jen.Code
		args := []jen.Code{jen.Id("vt"), jen.Id("self")}
		for i, a := range params {
			v := fmt.Sprintf("a%d", i)
			gparams = append(gparams, jen.Id(v).Add(goTypeCode(fn.Params().At(i).Type())))
			switch a.kind {
			case "string":
				p, n, free := fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i), fmt.Sprintf("free%d", i)
				pre = append(pre, jen.List(jen.Id(p), jen.Id(n), jen.Id(free)).Op(":=").Id("cBytes").Call(jen.Id(v)),
					jen.Defer().Id(free).Call())
				args = append(args, jen.Id(p), jen.Id(n))
			case "slice":
				args = append(args, jen.Id("cElems").Index(goCType(a.param.Type.Elem)).Call(jen.Id(v)), jen.Qual("C", "size_t").Call(jen.Len(jen.Id(v))))
			default:
				args = append(args, jen.Add(goCType(a.param.Type)).Call(jen.Id(v)))
			}
		}
		for i := range fn.Results().Len() {
			gresults = append(gresults, goTypeCode(fn.Results().At(i).Type()))
		}
		call := func(args ...jen.Code) *jen.Statement {
			return jen.Qual("C", fmt.Sprintf("kvcm__call_%s_%s", short, f.CName)).Call(args...)
		}
		var run []jen.Code
		switch {
		case len(results) == 1 && results[0].kind == "buffer":
			el := goCType(results[0].param.Type.Elem)
			elem := fn.Results().At(0).Type().Underlying().(*types.Slice).Elem()
			cb := jen.Func().Params(jen.Id("buf").Op("*").Add(el), jen.Id("capacity").Qual("C", "size_t"), jen.Id("needed").Op("*").Qual("C", "size_t")).Qual("C", "int32_t").Block(
				jen.Return(call(append(args, jen.Id("buf"), jen.Id("capacity"), jen.Id("needed"))...)))
			run = append(run, jen.Return(jen.Id("callBuffer").Index(jen.List(goTypeCode(elem), el)).Call(jen.Lit(f.CName), cb)))
		case len(results) == 1:
			run = append(run, jen.Var().Id("r").Add(goCType(results[0].param.Type.Elem)),
				jen.Id("rc").Op(":=").Add(call(append(args, jen.Op("&").Id("r"))...)),
				jen.Return(jen.Add(goTypeCode(fn.Results().At(0).Type())).Call(jen.Id("r")), jen.Id("slotError").Call(jen.Lit(f.CName), jen.Id("rc"))))
		case fn.Results().Len() == 1:
			run = append(run, jen.Return(jen.Id("slotError").Call(jen.Lit(f.CName), call(args...))))
		default:
			run = append(run, call(args...))
		}
		body = append(body, jen.If(jen.Qual("C", fmt.Sprintf("kvcm__has_%s_%s", short, f.CName)).Call(jen.Id("vt")).Op("!=").Lit(0)).Block(
			jen.Id("out").Dot(f.GoField()).Op("=").Func().Params(gparams...).Params(gresults...).Block(append(pre, run...)...)))
	}
	body = append(body, jen.Return(jen.Id("out")))
	name := "goCaller" + d.GoName
	return jen.Comment(fmt.Sprintf("%s returns a %s.%s whose funcs call the present slots of vt with self.", name, pathBase(g.Path), g.Name)).Line().
		Func().Id(name).Params(jen.Id("vt").Op("*").Qual("C", d.CName), jen.Id("self").Qual("C", "uintptr_t")).Add(goMapType(g)).Block(body...)
}

func pathBase(p string) string { return p[strings.LastIndex(p, "/")+1:] }
