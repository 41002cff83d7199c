package gen

import (
	"fmt"
	"go/types"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// GoMap ties an ABI struct to the Go struct of the core it carries
// (//kvcm:go in|out|inout <import path>.<Type>): kvcmgen writes the
// converters between the two into the export package, field by field.
//
//   - in: fromC<Decl>(c *C.<struct>, name string) (<Type>, error), for
//     structs the caller passes in. Scalars, enums and typedefs are cast to
//     the Go field's type; a const char* becomes a string (NULL is "" when
//     the field is nullable and an error naming it otherwise, pointer and
//     length when the field has a len tag); an array with a len tag
//     becomes a slice (a nullable one is nil exactly when the pointer is
//     NULL) and a pointer without one a *T, their structs converted by their
//     own in converters; a struct by value by its in converter. Fields
//     appended after a versioned struct's first version are read only when
//     struct_size covers them. Errors name the field (name + ".field[i]").
//   - out: toC<Decl>(s <Type>) C.<struct>, for results: every mapped field
//     is a scalar, enum or typedef, cast from the Go field or from a method's
//     result (go:"Name()") or from a field of a struct field
//     (go:"Field.Sub"), or an array with a len tag, written from a Go slice
//     (scalars cast, structs by their out converter) into a []C.<element>
//     parameter of toC<Decl> named after the field, which it points the
//     field at.
//
// A field of the ABI struct maps to the Go field of the same name, or of
// the name its go tag gives; go:"-" leaves it to the export glue. A field
// with neither a Go counterpart nor go:"-" is a generator error, so a new
// ABI field is never silently unconverted. struct_size, abi_version and
// the length fields of arrays and strings are never mapped.
type GoMap struct {
	In, Out bool
	Path    string // import path
	Name    string // type name
	Type    *types.Named
}

// parseGoMap parses the argument of //kvcm:go.
func parseGoMap(s string) (*GoMap, error) {
	dir, typ, ok := strings.Cut(s, " ")
	i := strings.LastIndex(typ, ".")
	if !ok || i <= 0 || i == len(typ)-1 {
		return nil, fmt.Errorf("bad //kvcm:go %q", s)
	}
	g := &GoMap{Path: typ[:i], Name: typ[i+1:]}
	switch dir {
	case "in":
		g.In = true
	case "out":
		g.Out = true
	case "inout":
		g.In, g.Out = true, true
	default:
		return nil, fmt.Errorf("bad //kvcm:go direction %q", dir)
	}
	return g, nil
}

// resolveGoMaps loads the packages the //kvcm:go directives name and checks
// every mapped field (see GoMap).
func resolveGoMaps(m *Model, dir string) error {
	var paths []string
	for _, d := range m.Decls {
		gs := []*GoMap{d.GoMap, d.GoCaller, d.GoModel}
		for _, g := range d.GoImpls {
			gs = append(gs, g.GoMap)
		}
		for _, g := range gs {
			if g != nil && !slices.Contains(paths, g.Path) {
				paths = append(paths, g.Path)
			}
		}
	}
	for _, f := range m.Funcs {
		if p, _, ok := callPackage(f.Call); ok && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
		for _, p := range f.Sig.Params {
			if p.Column != "" && p.ColumnOf == "" {
				if i := strings.LastIndex(p.GoElem, "."); i > 0 && !slices.Contains(paths, p.GoElem[:i]) {
					paths = append(paths, p.GoElem[:i])
				}
			}
		}
	}
	if len(paths) == 0 {
		return nil
	}
	slices.Sort(paths)
	pkgs, err := packages.Load(&packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: dir}, paths...)
	if err != nil {
		return fmt.Errorf("load the //kvcm:go packages: %w", err)
	}
	byPath := map[string]*types.Package{}
	for _, p := range pkgs {
		if len(p.Errors) > 0 {
			return fmt.Errorf("load %s: %v", p.PkgPath, p.Errors[0])
		}
		byPath[p.PkgPath] = p.Types
	}
	resolve := func(d *Decl, g *GoMap, directive string) error {
		if g == nil {
			return nil
		}
		p := byPath[g.Path]
		var obj types.Object
		if p != nil {
			obj = p.Scope().Lookup(g.Name)
		}
		named, ok := types.Unalias(typeOf(obj)).(*types.Named)
		if !ok {
			return fmt.Errorf("%s: //kvcm:%s names %s.%s, which is not a named type", d.GoName, directive, g.Path, g.Name)
		}
		if _, ok := named.Underlying().(*types.Signature); ok && d.Kind == DCallback {
			g.Type = named
			return nil
		}
		if _, ok := named.Underlying().(*types.Struct); !ok || d.Kind == DCallback {
			return fmt.Errorf("%s: //kvcm:%s names %s.%s, which is not a %s", d.GoName, directive, g.Path, g.Name, map[bool]string{true: "func type", false: "struct"}[d.Kind == DCallback])
		}
		g.Type = named
		return nil
	}
	for _, d := range m.Decls {
		if err := resolve(d, d.GoMap, "go"); err != nil {
			return err
		}
		if err := resolve(d, d.GoCaller, "gocaller"); err != nil {
			return err
		}
	}
	for _, d := range m.Decls {
		if d.GoMap != nil {
			for _, f := range MappedFields(d) {
				if err := checkMapped(d, f); err != nil {
					return err
				}
			}
		}
		if g := d.GoModel; g != nil {
			if err := resolve(d, g, "gomodel"); err != nil {
				return err
			}
		}
		if d.GoCaller != nil {
			if err := checkCaller(d); err != nil {
				return err
			}
		}
		for _, g := range d.GoImpls {
			if err := resolve(d, g.GoMap, "goimpl"); err != nil {
				return err
			}
			if err := checkGoImpl(d, g); err != nil {
				return err
			}
		}
	}
	for _, f := range m.Funcs {
		if f.Call != "" {
			if err := resolveCall(f, byPath); err != nil {
				return err
			}
		}
		if err := resolveColumns(f, byPath); err != nil {
			return err
		}
	}
	return checkCopied(m)
}

// callPackage splits a package-level //kvcm:call into its import path and
// the chain after it.
func callPackage(call string) (path, chain string, ok bool) {
	i := strings.LastIndex(call, "/")
	if i < 0 {
		return "", "", false
	}
	j := strings.Index(call[i:], ".")
	if j < 0 {
		return "", "", false
	}
	return call[:i+j], call[i+j+1:], true
}

// resolveCall finds the signature of the function a //kvcm:call names.
func resolveCall(f *Func, byPath map[string]*types.Package) error {
	where := fmt.Sprintf("%s: //kvcm:call %s", f.GoName, f.Call)
	var t types.Type
	var pkg *types.Package
	segs := strings.Split(f.Call, ".")
	if path, chain, ok := callPackage(f.Call); ok {
		pkg = byPath[path]
		segs = strings.Split(chain, ".")
		if pkg == nil {
			return fmt.Errorf("%s: package %s not loaded", where, path)
		}
		obj := pkg.Scope().Lookup(strings.TrimSuffix(segs[0], "()"))
		switch obj := obj.(type) {
		case *types.Var:
			t = obj.Type()
		case *types.Func:
			if len(segs) == 1 {
				f.CallSig = obj.Type().(*types.Signature)
				return nil
			}
			t = obj.Type().(*types.Signature).Results().At(0).Type()
		default:
			return fmt.Errorf("%s: %s has no variable or function %s", where, path, segs[0])
		}
		segs = segs[1:]
	} else {
		if len(f.Sig.Params) == 0 || f.Sig.Params[0].Type.Kind != KNamed || f.Sig.Params[0].Type.Decl.GoModel == nil {
			return fmt.Errorf("%s: a method chain needs a first parameter of a handle with //kvcm:gomodel", where)
		}
		g := f.Sig.Params[0].Type.Decl.GoModel
		t, pkg = types.NewPointer(g.Type), g.Type.Obj().Pkg()
	}
	for i, seg := range segs {
		name := strings.TrimSuffix(seg, "()")
		obj, _, _ := types.LookupFieldOrMethod(t, true, pkg, name)
		switch obj := obj.(type) {
		case *types.Func:
			sig := obj.Type().(*types.Signature)
			if i == len(segs)-1 {
				f.CallSig = sig
				return nil
			}
			if !strings.HasSuffix(seg, "()") || sig.Params().Len() != 0 || sig.Results().Len() != 1 {
				return fmt.Errorf("%s: %s is called with no arguments for its one result: write %s()", where, name, name)
			}
			t = sig.Results().At(0).Type()
		case *types.Var:
			if i == len(segs)-1 {
				return fmt.Errorf("%s: %s is a field, not a method", where, name)
			}
			t = obj.Type()
		default:
			return fmt.Errorf("%s: %s has no field or method %s", where, t, name)
		}
	}
	return fmt.Errorf("%s: names no function", where)
}

func typeOf(obj types.Object) types.Type {
	if tn, ok := obj.(*types.TypeName); ok {
		return tn.Type()
	}
	return nil
}

// MappedFields are the fields of a //kvcm:go struct that its converters
// carry: every field but struct_size, abi_version, the length fields of
// other fields and those tagged go:"-".
func MappedFields(d *Decl) []*Field {
	lens := map[string]bool{}
	for _, f := range d.Fields {
		if f.Len != "" {
			lens[f.Len] = true
		}
	}
	var out []*Field
	for _, f := range d.Fields {
		if f.Go == "-" || lens[f.CName] || d.Versioned && (f.CName == "struct_size" || f.CName == "abi_version") {
			continue
		}
		out = append(out, f)
	}
	return out
}

// GoField is the name of the Go field (or method, with "()") f maps to.
func (f *Field) GoField() string {
	if f.Go != "" {
		return f.Go
	}
	return f.GoName
}

// goTarget returns the Go field a mapped field converts to or from, or the
// result type of its method.
func goTarget(d *Decl, f *Field) (types.Type, bool) {
	named := d.GoMap.Type
	if name, ok := strings.CutSuffix(f.GoField(), "()"); ok {
		obj, _, _ := types.LookupFieldOrMethod(named, false, named.Obj().Pkg(), name)
		fn, ok := obj.(*types.Func)
		if !ok {
			return nil, false
		}
		sig := fn.Type().(*types.Signature)
		if sig.Params().Len() != 0 || sig.Results().Len() != 1 {
			return nil, false
		}
		return sig.Results().At(0).Type(), true
	}
	var t types.Type = named
	for _, name := range strings.Split(f.GoField(), ".") {
		obj, _, _ := types.LookupFieldOrMethod(t, false, named.Obj().Pkg(), name)
		v, ok := obj.(*types.Var)
		if !ok || !v.IsField() {
			return nil, false
		}
		t = v.Type()
	}
	return t, true
}

func checkMapped(d *Decl, f *Field) error {
	g := d.GoMap
	where := fmt.Sprintf("%s.%s (//kvcm:go %s.%s)", d.GoName, f.GoName, g.Path, g.Name)
	t, ok := goTarget(d, f)
	if !ok {
		return fmt.Errorf("%s: %s has no field %s: name its counterpart with a go:\"Field\" tag, or tag it go:\"-\" and convert it in the export glue",
			where, g.Name, f.GoField())
	}
	if strings.Contains(f.GoField(), ".") && g.In {
		return fmt.Errorf("%s: a field of a field (go:%q) can only be read: the struct must be //kvcm:go out", where, f.GoField())
	}
	if strings.HasSuffix(f.GoField(), "()") && g.In {
		return fmt.Errorf("%s: a method (go:%q) can only be read: the struct must be //kvcm:go out", where, f.GoField())
	}
	if g.Out && isOutArray(f) {
		if err := checkOutArray(where, f, t); err != nil {
			return err
		}
	} else if g.Out && !isScalarField(f.Type) {
		return fmt.Errorf("%s: an out converter writes scalars, enums, typedefs and arrays with a len tag only: tag it go:\"-\"", where)
	}
	if f.User != "" && !slices.ContainsFunc(d.Fields, func(u *Field) bool { return u.CName == f.User && u.Type.Kind == KVoidPtr }) {
		return fmt.Errorf("%s: user:%q names no void* field of %s", where, f.User, d.GoName)
	}
	if g.In {
		return checkIn(where, f, t)
	}
	return nil
}

// isOutArray reports whether an out converter writes f as an array with its
// count (into a nested buffer of the caller's, see toC<Decl>).
func isOutArray(f *Field) bool {
	return f.Type.Kind == KPtr && f.Type.Dir == DirIn && f.Len != ""
}

// checkOutArray checks that an out converter can write the Go slice t into
// f's array: scalars by a cast, structs by their own out converter.
func checkOutArray(where string, f *Field, t types.Type) error {
	sl, ok := t.Underlying().(*types.Slice)
	if !ok {
		return fmt.Errorf("%s: the array is written from a Go slice, not %s", where, t)
	}
	el := f.Type.Elem
	if isScalarField(el) {
		if b, ok := sl.Elem().Underlying().(*types.Basic); ok && b.Info()&types.IsNumeric != 0 {
			return nil
		}
		return fmt.Errorf("%s: cannot write %s elements from %s", where, el.CName(), sl.Elem())
	}
	if el.Kind == KNamed && el.Decl.Kind == DStruct {
		g := el.Decl.GoMap
		if n, ok := sl.Elem().(*types.Named); ok && g != nil && g.Out && n.Obj().Pkg().Path() == g.Path && n.Obj().Name() == g.Name && !hasOutArrays(el.Decl) {
			return nil
		}
		return fmt.Errorf("%s: its %s elements need a //kvcm:go out %s on %s, without arrays", where, el.Decl.CName, sl.Elem(), el.Decl.GoName)
	}
	return fmt.Errorf("%s: cannot write %s elements", where, el.CName())
}

// hasOutArrays reports whether the out converter of d writes arrays (and so
// takes the nested buffers they go to).
func hasOutArrays(d *Decl) bool {
	if d.GoMap == nil || !d.GoMap.Out {
		return false
	}
	for _, f := range MappedFields(d) {
		if isOutArray(f) {
			return true
		}
	}
	return false
}

func isScalarField(t *Type) bool {
	switch t.Kind {
	case KScalar, KSize:
		return true
	case KNamed:
		return t.Decl.Kind == DEnum || t.Decl.Kind == DTypedef || t.Decl.Kind == DHandle
	}
	return false
}

// checkIn checks that an in converter can write the Go type t from f.
func checkIn(where string, f *Field, t types.Type) error {
	u := t.Underlying()
	switch {
	case isScalarField(f.Type):
		if b, ok := u.(*types.Basic); ok && b.Info()&(types.IsNumeric|types.IsBoolean) != 0 {
			return nil
		}
	case f.Type.Kind == KCStr:
		if b, ok := u.(*types.Basic); ok && b.Info()&types.IsString != 0 {
			return nil
		}
	case f.Type.Kind == KPtr && f.Type.Dir == DirIn && f.Len != "":
		if s, ok := u.(*types.Slice); ok {
			return checkElem(where, f.Type.Elem, s.Elem())
		}
	case f.Type.Kind == KPtr && f.Type.Dir == DirIn:
		if p, ok := u.(*types.Pointer); ok {
			return checkElem(where, f.Type.Elem, p.Elem())
		}
	case f.Type.Kind == KNamed && f.Type.Decl.Kind == DStruct:
		return checkElem(where, f.Type, t)
	case f.Type.Kind == KNamed && f.Type.Decl.Kind == DCallback:
		g := f.Type.Decl.GoCaller
		if g == nil || f.User == "" {
			return fmt.Errorf("%s: a callback field needs //kvcm:gocaller on %s and a user:\"Field\" tag naming its user data", where, f.Type.Decl.GoName)
		}
		if !types.Identical(t, g.Type) {
			return fmt.Errorf("%s: the callback converts to %s.%s, not %s", where, g.Path, g.Name, t)
		}
		return nil
	}
	return fmt.Errorf("%s: cannot convert %s to %s: tag it go:\"-\" and convert it in the export glue", where, f.Type.CName(), t)
}

// checkElem checks an array element, pointee or struct field by value: a
// scalar cast, or a struct with an in converter to exactly that Go type.
func checkElem(where string, el *Type, t types.Type) error {
	if isScalarField(el) {
		if b, ok := t.Underlying().(*types.Basic); ok && b.Info()&types.IsNumeric != 0 {
			return nil
		}
	}
	if el.Kind == KNamed && el.Decl.Kind == DStruct {
		g := el.Decl.GoMap
		if n, ok := t.(*types.Named); ok && g != nil && g.In && n.Obj().Pkg().Path() == g.Path && n.Obj().Name() == g.Name {
			return nil
		}
		return fmt.Errorf("%s: its %s elements need a //kvcm:go in %s on %s", where, el.Decl.CName, t, el.Decl.GoName)
	}
	return fmt.Errorf("%s: cannot convert %s elements to %s", where, el.CName(), t)
}

// resolveColumns finds the Go field of every column of a function's buffer
// (column=) in the buffer's go= struct, and its width: an array field's
// length, 1 for a scalar.
func resolveColumns(f *Func, byPath map[string]*types.Package) error {
	for _, p := range f.Sig.Params {
		if p.Column == "" {
			continue
		}
		b := p
		if p.ColumnOf != "" {
			b = paramOf(f, p.ColumnOf)
		}
		where := fmt.Sprintf("%s: %s: column %s of %s", f.GoName, p.GoName, p.Column, b.GoElem)
		i := strings.LastIndex(b.GoElem, ".")
		if i <= 0 {
			return fmt.Errorf("%s: go= names no struct of a package", where)
		}
		pkg := byPath[b.GoElem[:i]]
		var named *types.Named
		if pkg != nil {
			named, _ = types.Unalias(typeOf(pkg.Scope().Lookup(b.GoElem[i+1:]))).(*types.Named)
		}
		if named == nil {
			return fmt.Errorf("%s: not a named type", where)
		}
		obj, _, _ := types.LookupFieldOrMethod(named, false, pkg, p.Column)
		v, ok := obj.(*types.Var)
		if !ok || !v.IsField() {
			return fmt.Errorf("%s: no such field", where)
		}
		switch t := v.Type().Underlying().(type) {
		case *types.Array:
			if _, ok := t.Elem().Underlying().(*types.Basic); !ok {
				return fmt.Errorf("%s: an array of %s, not of scalars", where, t.Elem())
			}
			p.ColumnWidth = t.Len()
		case *types.Basic:
			p.ColumnWidth = 1
		default:
			return fmt.Errorf("%s: %s is neither a scalar nor an array of scalars", where, v.Type())
		}
	}
	return nil
}
