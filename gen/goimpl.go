package gen

import (
	"fmt"
	"go/types"
	"slices"

	"github.com/dave/jennifer/jen"
)

// A vtable with //kvcm:goimpl <impl> <import path>.<Type> is implemented
// in Go by the methods of *<Type>, one per slot, of the slot's Go name (or
// its go:"Name" tag). The handle table holds the objects: a slot's self is
// the handle of a *<Type>, which the generated lookup<Impl>(self) finds.
// Each slot's export maps the parameters after self by the conventions of
// //kvcm:gocaller, the other way round:
//
//   - const T* p, n (T a struct with //kvcm:go, n a size_t or an integer
//     typedef): a []G of T's Go struct, converted by T's in converter (a
//     NULL p with n > 0, or a struct it rejects, fails the slot);
//   - const T* p (T a struct without //kvcm:go), void* or const void*: an
//     address, a Go uintptr type, passed as is;
//   - a scalar: a G parameter, cast.
//
// An int32_t slot result is the method's error (0 for nil, the fail value
// otherwise); any other scalar result is the method's only result, cast.
// The destroy slot frees self's handle first and calls Destroy only when
// it did, so that one destroy of concurrent ones runs it.

// goImplMethod returns the signature of the method of g's type that
// implements slot, or nil.
func goImplMethod(g *GoImpl, slot *Field) *types.Signature {
	obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(g.Type), true, g.Type.Obj().Pkg(), slot.GoField())
	fn, ok := obj.(*types.Func)
	if !ok {
		return nil
	}
	return fn.Type().(*types.Signature)
}

// checkGoImpl checks that g's type has a method for every slot of d with
// the signature the conventions give.
func checkGoImpl(d *Decl, g *GoImpl) error {
	for _, f := range goImplSlots(d) {
		where := fmt.Sprintf("%s.%s (//kvcm:goimpl %s %s.%s)", d.GoName, f.GoName, g.Impl, g.Path, g.Name)
		fn := goImplMethod(g, f)
		if fn == nil {
			return fmt.Errorf("%s: *%s has no method %s", where, g.Name, f.GoField())
		}
		params, results, err := callerParams(f.CName, f.Type.Sig)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if len(results) > 0 {
			return fmt.Errorf("%s: a Go implementation's slot has no out-parameters", where)
		}
		for _, a := range params {
			if !slices.Contains([]string{"structs", "address", "value"}, a.kind) {
				return fmt.Errorf("%s: parameter %s, a %s, follows no convention of //kvcm:goimpl", where, a.param.CName, a.kind)
			}
		}
		if err := checkCallerSig(where, f.CName, f.Type.Sig, fn); err != nil {
			return err
		}
	}
	return nil
}

// goImplLookup writes lookup<Impl>, which finds the object behind a slot's
// self.
func goImplLookup(d *Decl, g *GoImpl) jen.Code {
	name := "lookup" + Camel(g.Impl)
	obj := jen.Op("*").Qual(g.Path, g.Name)
	return jen.Commentf("%s finds the *%s.%s of the handle self of the %s %s's slots.", name, pathBase(g.Path), g.Name, g.Impl, d.CName).Line().
		Func().Id(name).Params(jen.Id("self").Qual("C", "uintptr_t")).Params(obj, jen.Bool()).Block(
		jen.List(jen.Id("v"), jen.Id("_")).Op(":=").Id("handleValue").Call(jen.Uint64().Call(jen.Id("self"))),
		jen.List(jen.Id("obj"), jen.Id("ok")).Op(":=").Id("v").Assert(obj.Clone()),
		jen.Return(jen.Id("obj"), jen.Id("ok")))
}

// goImplFail is the fail value of a slot: its fail tag (a number or a C
// constant), else false, -1 for an int32_t failure code, or 0.
func goImplFail(slot *Field) jen.Code {
	r := slot.Type.Sig.Result
	switch {
	case slot.Fail != "" && (slot.Fail[0] == '-' || '0' <= slot.Fail[0] && slot.Fail[0] <= '9'):
		return jen.Id(slot.Fail)
	case slot.Fail != "":
		return jen.Qual("C", slot.Fail)
	case r.Kind == KScalar && r.Scalar == "bool":
		return jen.False()
	case isRC(r):
		return jen.Lit(-1)
	}
	return jen.Lit(0)
}

// goImplSlotExport writes the Go export a slot of a Go implementation of a
// vtable forwards to: it returns the slot's fail value when self is not a
// live object of the implementation or the library is poisoned, turns a
// panic into that value and poisons the library, and otherwise converts
// the slot's parameters and calls the object's method. A slot without a
// result runs also on a poisoned library, so that destroy releases.
func goImplSlotExport(d *Decl, g *GoImpl, slot *Field) (string, *jen.Statement) {
	name := fmt.Sprintf("kvcm__go_%s_%s", g.Impl, slot.CName)
	sig := slot.Type.Sig
	method := goImplMethod(g, slot)
	var cparams []jen.Code
	for _, p := range sig.Params {
		t := goCType(p.Type)
		if p.Type.IsPointer() {
			t = jen.Qual("C", "uintptr_t")
		}
		cparams = append(cparams, jen.Id(p.CName).Add(t))
	}
	void := sig.Result.Kind == KVoid
	fail := goImplFail(slot)
	ret := func() jen.Code {
		if void {
			return jen.Return()
		}
		return jen.Return(fail)
	}
	params, _, _ := callerParams(slot.CName, sig)
	var convert, args []jen.Code
	for i, a := range params {
		t := method.Params().At(i).Type()
		if a.kind != "structs" {
			args = append(args, castTo(t, jen.Id(a.param.CName)))
			continue
		}
		v := fmt.Sprintf("a%d", i)
		el := a.param.Type.Elem.Decl
		count := sig.Params[slices.Index(sig.Params, a.param)+1]
		convert = append(convert,
			jen.List(jen.Id(v), jen.Err()).Op(":=").Id("cStructsArg").Call(
				jen.Parens(jen.Op("*").Qual("C", el.CName)).Call(jen.Qual("C", "kvcm__ptr").Call(jen.Id(a.param.CName))),
				jen.Qual("C", "size_t").Call(jen.Id(count.CName)), jen.Lit(a.param.CName), jen.Id("fromC"+el.GoName)),
			jen.If(jen.Err().Op("!=").Nil()).Block(ret()))
		args = append(args, jen.Id(v))
	}
	call := jen.Id("obj").Dot(slot.GoField()).Call(args...)
	self := sig.Params[0].CName
	lookup := jen.List(jen.Id("obj"), jen.Id("ok")).Op(":=").Id("lookup" + Camel(g.Impl)).Call(jen.Id(self))
	body := []jen.Code{jen.Const().Id("kvcmFn").Op("=").Lit(fmt.Sprintf("%s %s.%s", g.Impl, d.CName, slot.CName))}
	if !void {
		body = append(body, jen.Id("result").Op("=").Add(fail))
	}
	body = append(body, jen.Defer().Func().Params().Block(jen.If(jen.Id("r").Op(":=").Recover(), jen.Id("r").Op("!=").Nil()).Block(jen.Id("poison").Call(jen.Id("kvcmFn"), jen.Id("r")))).Call(), lookup)
	fn := jen.Func().Id(name).Params(cparams...)
	switch {
	case void && slot.CName == "destroy":
		body = append(body, jen.If(jen.Id("ok").Op("&&").Id("deleteHandle").Call(jen.Uint64().Call(jen.Id(self)))).Block(call))
		return name, fn.Block(body...)
	case void:
		body = append(body, jen.If(jen.Op("!").Id("ok")).Block(jen.Return()))
		body = append(body, convert...)
		return name, fn.Block(append(body, call)...)
	}
	body = append(body, jen.If(jen.Op("!").Id("ok").Op("||").Id("isPoisoned").Call()).Block(ret()))
	body = append(body, convert...)
	if isRC(sig.Result) {
		body = append(body, jen.If(jen.Err().Op(":=").Add(call), jen.Err().Op("!=").Nil()).Block(ret()), jen.Return(jen.Lit(0)))
	} else {
		body = append(body, jen.Return(jen.Add(goCType(sig.Result)).Call(call)))
	}
	return name, fn.Params(jen.Id("result").Add(goCType(sig.Result))).Block(body...)
}
