package gen

import (
	"fmt"
	"go/types"
	"slices"
	"strings"

	"github.com/dave/jennifer/jen"
)

// A vtable with //kvcm:gocaller <import path>.<Type> names a Go struct of
// funcs (such as core/cp.External or abimodel.ExternalCodec) that calls the
// vtable: kvcmgen writes goCaller<Decl>(vt, self) <Type>, which sets the
// func field of the slot's name for every slot present (struct_size covers
// it and it is non-null). Slots tagged go:"-" are left to the export glue.
// A //kvcm:callback with //kvcm:gocaller <import path>.<Type> names a Go
// func type: kvcmgen writes goCaller<Decl>(fn, userData) <Type>, nil when fn
// is NULL, the callback's first parameter (void*) taking userData. The
// parameters after self (or userData) map to the Go func's by their
// convention:
//
//   - const char* p, size_t pLen: a string, copied into C memory for the
//     call (NULL for "");
//   - const T* p, size_t n (T a scalar): a []G whose elements have T's size,
//     passed in place (NULL when empty);
//   - const T* p, n (T a struct with //kvcm:go, n a size_t or an integer
//     typedef): a []G of T's Go struct, copied into C memory for the call
//     (one allocation per array, nested arrays and strings with a length
//     included);
//   - const T* p (T a struct without //kvcm:go), void* or const void*: an
//     address, a Go uintptr type, passed as is; the Go side keeps what it
//     points to valid for the call (it pins Go memory);
//   - T* p, size_t capacity, size_t* needed (T a scalar): a []G result,
//     asked for with 64 elements and once more with the needed count;
//   - T* p (T a scalar) with the slot's sized:"p=n" tag: a []G result of as
//     many elements as the size_t n says (the length of the input array n
//     counts), passed in place, all ones where the slot writes nothing;
//   - T* p (T a scalar): a G result;
//   - a scalar: a G parameter, cast.
//
// An int32_t slot result is the func's last result, an error when not 0
// ("<slot> returned <rc>"); any other scalar result (bool, size_t, an enum
// or typedef) is the func's only result, cast.
type callerArg struct {
	kind  string // string, slice, structs, address, buffer, out, value
	param *Param // the first C parameter it stands for
}

// callerArgs classifies a slot's parameters after self into the Go func's
// parameters and results.
func callerArgs(slot *Field) (params, results []callerArg, err error) {
	return callerParams(slot.CName, slot.Type.Sig)
}

// isCount reports whether t can be an array's count: size_t or an integer
// typedef.
func isCount(t *Type) bool {
	return t.Kind == KSize || t.Kind == KNamed && t.Decl.Kind == DTypedef && t.Decl.Base.Kind == KScalar && t.Decl.Base.Scalar != "bool" && t.Decl.Base.Scalar != "double"
}

// callerParams classifies the parameters after the first (self or user
// data) of the signature of the slot or callback name.
func callerParams(name string, sig *Sig) (params, results []callerArg, err error) {
	ps := sig.Params
	if len(ps) == 0 || ps[0].Type.Kind != KVoidPtr {
		return nil, nil, fmt.Errorf("%s does not take self (void*) first", name)
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
		structIn := t.Kind == KPtr && t.Dir == DirIn && t.Elem.Kind == KNamed && t.Elem.Decl.Kind == DStruct
		switch {
		case t.Kind == KCStr && ps[i].Len != "":
			params, i = append(params, callerArg{"string", ps[i]}), i+2
		case t.Kind == KPtr && t.Dir == DirIn && isScalarField(t.Elem) && at(i+1).Kind == KSize:
			params, i = append(params, callerArg{"slice", ps[i]}), i+2
		case structIn && t.Elem.Decl.GoMap != nil && isCount(at(i+1)):
			params, i = append(params, callerArg{"structs", ps[i]}), i+2
		case structIn && t.Elem.Decl.GoMap == nil, t.Kind == KVoidPtr, t.Kind == KConstVoidPtr:
			params, i = append(params, callerArg{"address", ps[i]}), i+1
		case out && ps[i].Len != "":
			results, i = append(results, callerArg{"sized", ps[i]}), i+1
		case out && at(i+1).Kind == KSize && at(i+2).Kind == KPtr && at(i+2).Dir == DirOut && at(i+2).Elem.Kind == KSize:
			results, i = append(results, callerArg{"buffer", ps[i]}), i+3
		case out:
			results, i = append(results, callerArg{"out", ps[i]}), i+1
		case isScalarField(t):
			params, i = append(params, callerArg{"value", ps[i]}), i+1
		default:
			return nil, nil, fmt.Errorf("%s: parameter %s follows no convention of //kvcm:gocaller: tag the slot go:\"-\"", name, ps[i].CName)
		}
	}
	r := sig.Result
	if len(results) > 1 || len(results) == 1 && r.Kind != KVoid && !isRC(r) {
		return nil, nil, fmt.Errorf("%s: a Go caller has at most one result besides its error", name)
	}
	if r.Kind != KVoid && !isScalarField(r) {
		return nil, nil, fmt.Errorf("%s: its result follows no convention of //kvcm:gocaller", name)
	}
	return params, results, nil
}

// isRC reports whether a slot's result is a failure code (int32_t).
func isRC(t *Type) bool { return t.Kind == KScalar && t.Scalar == "int32_t" }

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

// checkCaller checks that every called slot's Go func (or the callback's
// Go func type) has the signature its conventions give.
func checkCaller(d *Decl) error {
	g := d.GoCaller
	if d.Kind == DCallback {
		fn, ok := g.Type.Underlying().(*types.Signature)
		if !ok {
			return fmt.Errorf("%s: //kvcm:gocaller %s.%s on a callback names a func type", d.GoName, g.Path, g.Name)
		}
		return checkCallerSig(fmt.Sprintf("%s (//kvcm:gocaller %s.%s)", d.GoName, g.Path, g.Name), d.CName, d.Callback, fn)
	}
	st, ok := g.Type.Underlying().(*types.Struct)
	if !ok {
		return fmt.Errorf("%s: //kvcm:gocaller %s.%s on a vtable names a struct of funcs", d.GoName, g.Path, g.Name)
	}
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
		if err := checkCallerSig(where, f.CName, f.Type.Sig, fn); err != nil {
			return err
		}
	}
	return nil
}

// checkCallerSig checks the Go func fn of the slot or callback name.
func checkCallerSig(where, name string, sig *Sig, fn *types.Signature) error {
	params, results, err := callerParams(name, sig)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	rc := isRC(sig.Result)
	nres := len(results)
	if rc || sig.Result.Kind != KVoid {
		nres++
	}
	if fn.Params().Len() != len(params) || fn.Results().Len() != nres {
		return fmt.Errorf("%s: want %d parameters and %d results, the func has %d and %d", where, len(params), nres, fn.Params().Len(), fn.Results().Len())
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
	switch {
	case rc && !types.Identical(fn.Results().At(nres-1).Type(), types.Universe.Lookup("error").Type()):
		return fmt.Errorf("%s: the int32_t result maps to a last result of type error", where)
	case !rc && sig.Result.Kind != KVoid && !isNumericOrBool(fn.Results().At(0).Type()):
		return fmt.Errorf("%s: the %s result cannot be %s", where, sig.Result.CName(), fn.Results().At(0).Type())
	}
	return nil
}

var goSizes = types.SizesFor("gc", "amd64")

func isNumeric(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&types.IsNumeric != 0
}

func isNumericOrBool(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&(types.IsNumeric|types.IsBoolean) != 0
}

// callerTypeOK reports whether the Go type t fits the argument's convention.
func callerTypeOK(a callerArg, t types.Type) bool {
	switch a.kind {
	case "string":
		b, ok := t.Underlying().(*types.Basic)
		return ok && b.Info()&types.IsString != 0
	case "slice", "buffer", "sized":
		s, ok := t.Underlying().(*types.Slice)
		size, _ := a.param.Type.Elem.sizeAlign()
		return ok && isNumeric(s.Elem()) && goSizes.Sizeof(s.Elem()) == int64(size)
	case "structs":
		s, ok := t.Underlying().(*types.Slice)
		g := a.param.Type.Elem.Decl.GoMap
		n, isNamed := types.Unalias(elemOf(s, ok)).(*types.Named)
		return isNamed && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == g.Path && n.Obj().Name() == g.Name
	case "address":
		b, ok := t.Underlying().(*types.Basic)
		return ok && b.Kind() == types.Uintptr
	}
	return isNumericOrBool(t)
}

func elemOf(s *types.Slice, ok bool) types.Type {
	if !ok {
		return nil
	}
	return s.Elem()
}

// copiedDecls are the structs the Go callers copy into C memory (the
// elements of structs arguments and their nested arrays), each once, in
// the order met.
func copiedDecls(m *Model) []*Decl {
	var out []*Decl
	var add func(d *Decl)
	add = func(d *Decl) {
		if slices.Contains(out, d) {
			return
		}
		out = append(out, d)
		for _, f := range MappedFields(d) {
			if f.Type.Kind == KPtr && f.Type.Elem.Kind == KNamed && f.Type.Elem.Decl.Kind == DStruct {
				add(f.Type.Elem.Decl)
			}
		}
	}
	for _, d := range m.Decls {
		if d.GoCaller == nil || d.Kind != DStruct {
			continue
		}
		for _, f := range callerSlots(d) {
			params, _, _ := callerArgs(f)
			for _, a := range params {
				if a.kind == "structs" {
					add(a.param.Type.Elem.Decl)
				}
			}
		}
	}
	return out
}

// checkCopied checks that the Go callers can copy every struct they copy:
// each mapped field is a scalar or an array (with len) of scalars or of
// structs with //kvcm:go, and nothing is left to the glue.
func checkCopied(m *Model) error {
	for _, d := range copiedDecls(m) {
		for _, f := range d.Fields {
			if f.Go == "-" {
				return fmt.Errorf("%s.%s: a struct a Go caller copies into C memory maps every field (go:\"-\")", d.GoName, f.GoName)
			}
		}
		for _, f := range MappedFields(d) {
			arr := f.Type.Kind == KPtr && f.Type.Dir == DirIn && f.Len != ""
			ok := isScalarField(f.Type) || f.Type.Kind == KCStr && f.Len != "" || arr && (isScalarField(f.Type.Elem) || f.Type.Elem.Kind == KNamed && f.Type.Elem.Decl.GoMap != nil)
			if !ok {
				return fmt.Errorf("%s.%s: a Go caller copies scalars, strings with a length and arrays of scalars or of //kvcm:go structs into C memory, not %s", d.GoName, f.GoName, f.Type.CName())
			}
		}
	}
	return nil
}

// cCopier writes cArg<Decl>, which copies a []G into C memory of a.
func cCopier(d *Decl) jen.Code {
	g := d.GoMap
	var body []jen.Code
	for _, f := range MappedFields(d) {
		dst := jen.Id("c").Dot(f.CName)
		src := jen.Id("v").Dot(f.GoField())
		switch {
		case isScalarField(f.Type):
			body = append(body, dst.Op("=").Add(goCType(f.Type)).Call(src))
		case f.Type.Kind == KCStr:
			body = append(body, dst.Op("=").Id("cArgString").Call(jen.Id("a"), src),
				jen.Id("c").Dot(f.Len).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("v").Dot(f.GoField()))))
		case isScalarField(f.Type.Elem):
			body = append(body, dst.Op("=").Id("cArgScalars").Index(goCType(f.Type.Elem)).Call(jen.Id("a"), src),
				jen.Id("c").Dot(f.Len).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("v").Dot(f.GoField()))))
		default:
			body = append(body, dst.Op("=").Id("cArg"+f.Type.Elem.Decl.GoName).Call(jen.Id("a"), src),
				jen.Id("c").Dot(f.Len).Op("=").Qual("C", "size_t").Call(jen.Len(jen.Id("v").Dot(f.GoField()))))
		}
	}
	name := "cArg" + d.GoName
	return jen.Commentf("%s copies s into C memory of a (NULL when empty).", name).Line().
		Func().Id(name).Params(jen.Id("a").Op("*").Id("cArena"), jen.Id("s").Index().Add(goMapType(g))).Op("*").Qual("C", d.CName).Block(
		jen.If(jen.Len(jen.Id("s")).Op("==").Lit(0)).Block(jen.Return(jen.Nil())),
		jen.Id("out").Op(":=").Id("cAlloc").Index(jen.Qual("C", d.CName)).Call(jen.Id("a"), jen.Len(jen.Id("s"))),
		jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Id("s")).Block(
			append([]jen.Code{jen.Id("c").Op(":=").Op("&").Id("out").Index(jen.Id("i"))}, body...)...),
		jen.Return(jen.Op("&").Id("out").Index(jen.Lit(0))),
	)
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
	f.Comment("cArena holds the C memory of one call's copied arguments; free releases it.")
	f.Type().Id("cArena").Struct(jen.Id("mem").Index().Qual("unsafe", "Pointer"))
	f.Line()
	f.Comment("cAlloc allocates n zeroed elements of T in a (out of C memory is a panic,")
	f.Comment("which fails the call).")
	f.Func().Id("cAlloc").Types(jen.Id("T").Any()).Params(jen.Id("a").Op("*").Id("cArena"), jen.Id("n").Int()).Index().Id("T").Block(
		jen.Id("p").Op(":=").Qual("C", "calloc").Call(jen.Qual("C", "size_t").Call(jen.Id("n")), jen.Qual("C", "size_t").Call(jen.Qual("unsafe", "Sizeof").Call(jen.Op("*").New(jen.Id("T"))))),
		jen.If(jen.Id("p").Op("==").Nil()).Block(jen.Panic(jen.Lit("out of C memory for a call's arguments"))),
		jen.Id("a").Dot("mem").Op("=").Append(jen.Id("a").Dot("mem"), jen.Id("p")),
		jen.Return(jen.Qual("unsafe", "Slice").Call(jen.Parens(jen.Op("*").Id("T")).Call(jen.Id("p")), jen.Id("n"))),
	)
	f.Line()
	f.Func().Params(jen.Id("a").Op("*").Id("cArena")).Id("free").Params().Block(
		jen.For(jen.List(jen.Id("_"), jen.Id("p")).Op(":=").Range().Id("a").Dot("mem")).Block(jen.Qual("C", "free").Call(jen.Id("p"))),
	)
	f.Line()
	f.Comment("cArgString copies s into C memory of a (NULL for \"\"), not NUL-terminated.")
	f.Func().Id("cArgString").Params(jen.Id("a").Op("*").Id("cArena"), jen.Id("s").String()).Op("*").Qual("C", "char").Block(
		jen.If(jen.Id("s").Op("==").Lit("")).Block(jen.Return(jen.Nil())),
		jen.Id("b").Op(":=").Id("cAlloc").Index(jen.Byte()).Call(jen.Id("a"), jen.Len(jen.Id("s"))),
		jen.Copy(jen.Id("b"), jen.Id("s")),
		jen.Return(jen.Parens(jen.Op("*").Qual("C", "char")).Call(jen.Qual("unsafe", "Pointer").Call(jen.Op("&").Id("b").Index(jen.Lit(0))))),
	)
	f.Line()
	f.Comment("cArgScalars copies s into C memory of a, converted to E (NULL when empty).")
	f.Func().Id("cArgScalars").Types(jen.Id("E"), jen.Id("G").Id("number")).Params(jen.Id("a").Op("*").Id("cArena"), jen.Id("s").Index().Id("G")).Op("*").Id("E").Block(
		jen.If(jen.Len(jen.Id("s")).Op("==").Lit(0)).Block(jen.Return(jen.Nil())),
		jen.Id("out").Op(":=").Id("cAlloc").Index(jen.Id("E")).Call(jen.Id("a"), jen.Len(jen.Id("s"))),
		jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Id("s")).Block(jen.Id("out").Index(jen.Id("i")).Op("=").Id("E").Call(jen.Id("v"))),
		jen.Return(jen.Op("&").Id("out").Index(jen.Lit(0))),
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

// callerFunc writes the Go func literal of type fn that calls the slot or
// callback name of signature sig through call (given the C arguments after
// self or the user data).
func callerFunc(name string, sig *Sig, fn *types.Signature, call func(args ...jen.Code) *jen.Statement) jen.Code {
	params, results, _ := callerParams(name, sig)
	var gparams, gresults, pre, args []jen.Code
	if slices.ContainsFunc(params, func(a callerArg) bool { return a.kind == "structs" }) {
		pre = append(pre, jen.Id("arena").Op(":=").Op("&").Id("cArena").Values(), jen.Defer().Id("arena").Dot("free").Call())
	}
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
		case "structs":
			count := sig.Params[slices.Index(sig.Params, a.param)+1].Type
			args = append(args, jen.Id("cArg"+a.param.Type.Elem.Decl.GoName).Call(jen.Id("arena"), jen.Id(v)), jen.Add(goCType(count)).Call(jen.Len(jen.Id(v))))
		case "address":
			if a.param.Type.Kind == KPtr {
				args = append(args, jen.Parens(jen.Op("*").Qual("C", a.param.Type.Elem.Decl.CName)).Call(jen.Qual("C", "kvcm__ptr").Call(jen.Qual("C", "uintptr_t").Call(jen.Id(v)))))
			} else {
				args = append(args, jen.Qual("C", "uintptr_t").Call(jen.Id(v)))
			}
		default:
			args = append(args, jen.Add(goCType(a.param.Type)).Call(jen.Id(v)))
		}
	}
	for i := range fn.Results().Len() {
		gresults = append(gresults, goTypeCode(fn.Results().At(i).Type()))
	}
	var run []jen.Code
	switch {
	case len(results) == 1 && results[0].kind == "sized":
		el := goCType(results[0].param.Type.Elem)
		elem := goTypeCode(fn.Results().At(0).Type().Underlying().(*types.Slice).Elem())
		var n jen.Code
		for k, a := range params {
			if a.param.CName == results[0].param.Len {
				n = jen.Int().Call(jen.Id(fmt.Sprintf("a%d", k)))
			} else if j := slices.Index(sig.Params, a.param); j+1 < len(sig.Params) && sig.Params[j+1].CName == results[0].param.Len {
				n = jen.Len(jen.Id(fmt.Sprintf("a%d", k)))
			}
		}
		run = append(run, jen.Id("buf").Op(":=").Make(jen.Index().Add(elem), n),
			jen.For(jen.Id("i").Op(":=").Range().Id("buf")).Block(jen.Id("buf").Index(jen.Id("i")).Op("=").Op("^").Add(elem).Call(jen.Lit(0))),
			jen.If(jen.Err().Op(":=").Id("slotError").Call(jen.Lit(name), call(append(args, jen.Id("cElems").Index(el).Call(jen.Id("buf")))...)), jen.Err().Op("!=").Nil()).Block(
				jen.Return(jen.Nil(), jen.Err())),
			jen.Return(jen.Id("buf"), jen.Nil()))
	case len(results) == 1 && results[0].kind == "buffer":
		el := goCType(results[0].param.Type.Elem)
		elem := fn.Results().At(0).Type().Underlying().(*types.Slice).Elem()
		cb := jen.Func().Params(jen.Id("buf").Op("*").Add(el), jen.Id("capacity").Qual("C", "size_t"), jen.Id("needed").Op("*").Qual("C", "size_t")).Qual("C", "int32_t").Block(
			jen.Return(call(append(args, jen.Id("buf"), jen.Id("capacity"), jen.Id("needed"))...)))
		run = append(run, jen.Return(jen.Id("callBuffer").Index(jen.List(goTypeCode(elem), el)).Call(jen.Lit(name), cb)))
	case len(results) == 1:
		run = append(run, jen.Var().Id("r").Add(goCType(results[0].param.Type.Elem)),
			jen.Id("rc").Op(":=").Add(call(append(args, jen.Op("&").Id("r"))...)),
			jen.Return(jen.Add(goTypeCode(fn.Results().At(0).Type())).Call(jen.Id("r")), jen.Id("slotError").Call(jen.Lit(name), jen.Id("rc"))))
	case isRC(sig.Result):
		run = append(run, jen.Return(jen.Id("slotError").Call(jen.Lit(name), call(args...))))
	case sig.Result.Kind != KVoid:
		run = append(run, jen.Return(castTo(fn.Results().At(0).Type(), call(args...))))
	default:
		run = append(run, call(args...))
	}
	return jen.Func().Params(gparams...).Params(gresults...).Block(append(pre, run...)...)
}

// goCaller writes goCaller<Decl>.
func goCaller(m *Model, d *Decl) jen.Code {
	g := d.GoCaller
	short := strings.TrimPrefix(d.CName, m.Prefix+"_")
	name := "goCaller" + d.GoName
	if d.Kind == DCallback {
		fn := g.Type.Underlying().(*types.Signature)
		call := func(args ...jen.Code) *jen.Statement {
			return jen.Qual("C", "kvcm__call_"+short).Call(append([]jen.Code{jen.Id("fn"), jen.Id("userData")}, args...)...)
		}
		return jen.Commentf("%s returns a %s.%s that calls fn with userData (nil when fn is NULL).", name, pathBase(g.Path), g.Name).Line().
			Func().Id(name).Params(jen.Id("fn").Qual("C", d.CName), jen.Id("userData").Qual("C", "uintptr_t")).Add(goMapType(g)).Block(
			jen.If(jen.Id("fn").Op("==").Nil()).Block(jen.Return(jen.Nil())),
			jen.Return(callerFunc(d.CName, d.Callback, fn, call)))
	}
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
		call := func(args ...jen.Code) *jen.Statement {
			return jen.Qual("C", fmt.Sprintf("kvcm__call_%s_%s", short, f.CName)).Call(append([]jen.Code{jen.Id("vt"), jen.Id("self")}, args...)...)
		}
		body = append(body, jen.If(jen.Qual("C", fmt.Sprintf("kvcm__has_%s_%s", short, f.CName)).Call(jen.Id("vt")).Op("!=").Lit(0)).Block(
			jen.Id("out").Dot(f.GoField()).Op("=").Add(callerFunc(f.CName, f.Type.Sig, fieldType(f.GoField()), call))))
	}
	body = append(body, jen.Return(jen.Id("out")))
	return jen.Comment(fmt.Sprintf("%s returns a %s.%s whose funcs call the present slots of vt with self.", name, pathBase(g.Path), g.Name)).Line().
		Func().Id(name).Params(jen.Id("vt").Op("*").Qual("C", d.CName), jen.Id("self").Qual("C", "uintptr_t")).Add(goMapType(g)).Block(body...)
}

// vtableCheck writes check<Decl>(vt, arg), which reports what makes a
// caller's vtable unusable, naming arg: abi_version 0, a struct_size that
// does not cover the slots of the vtable's first version that must be
// present (with none, the 8 bytes of struct_size and abi_version), or such
// a slot NULL.
func vtableCheck(m *Model, d *Decl) jen.Code {
	short := strings.TrimPrefix(d.CName, m.Prefix+"_")
	name := "check" + d.GoName
	vt := func(field string) *jen.Statement { return jen.Id("vt").Dot(field) }
	arg := func(field string) *jen.Statement { return jen.Id("arg").Op("+").Lit("." + field) }
	required := slices.ContainsFunc(goImplSlots(d), func(f *Field) bool { return !f.Nullable })
	var size jen.Code = jen.Lit(8)
	what := "the %d bytes of struct_size and abi_version"
	if required {
		size = jen.Qual("C", strings.ToUpper(strings.Replace(d.CName, m.Prefix+"_", m.Prefix+"__", 1))+fmt.Sprintf("_SIZE_V%d", d.Since))
		what = fmt.Sprintf("the %%d bytes of ABI version %d", d.Since)
	}
	body := []jen.Code{
		jen.If(vt("abi_version").Op("==").Lit(0)).Block(jen.Return(jen.Id("argError").Call(arg("abi_version"), jen.Lit("is 0: set it to KVCM_ABI_VERSION")))),
		jen.If(vt("struct_size").Op("<").Add(size)).Block(jen.Return(jen.Id("argError").Call(arg("struct_size"), jen.Lit("is %d, less than "+what), vt("struct_size"), size))),
	}
	if required {
		body = append(body, jen.If(jen.Id("name").Op(":=").Qual("C", "kvcm__missing_"+short).Call(jen.Id("vt")), jen.Id("name").Op("!=").Nil()).Block(
			jen.Return(jen.Id("argError").Call(jen.Id("arg").Op("+").Lit(".").Op("+").Qual("C", "GoString").Call(jen.Id("name")), jen.Lit("is NULL")))))
	}
	return jen.Commentf("%s reports what makes a caller's %s unusable, naming arg.", name, d.CName).Line().
		Func().Id(name).Params(jen.Id("vt").Op("*").Qual("C", d.CName), jen.Id("arg").String()).Error().Block(append(body, jen.Return(jen.Nil()))...)
}

func pathBase(p string) string { return p[strings.LastIndex(p, "/")+1:] }
