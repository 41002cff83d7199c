package gen

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/packages"
)

// SpecPath is the import path of the marker types.
const SpecPath = "github.com/kvcm/kvcm/gen/spec"

// Load reads the description package pattern (relative to dir) and builds
// its model.
func Load(dir, pattern string) (*Model, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax |
			packages.NeedTypes | packages.NeedTypesInfo,
		Dir: dir,
	}
	pkgs, err := packages.Load(cfg, pattern)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", pattern, err)
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("load %s: want one package, got %d", pattern, len(pkgs))
	}
	p := pkgs[0]
	if len(p.Errors) > 0 {
		var msgs []string
		for _, e := range p.Errors {
			msgs = append(msgs, e.Error())
		}
		return nil, fmt.Errorf("load %s: %s", pattern, strings.Join(msgs, "; "))
	}
	l := &loader{enumOpts: map[string]map[string]string{}, pkg: p, m: &Model{Package: p.PkgPath, Prefix: "kvcm", byGo: map[string]*Decl{}}}
	if err := l.run(); err != nil {
		return nil, err
	}
	if err := resolveGoMaps(l.m, dir); err != nil {
		return nil, err
	}
	return l.m, nil
}

type loader struct {
	pkg      *packages.Package
	m        *Model
	specs    []typeSpec
	enumOpts map[string]map[string]string
}

type typeSpec struct {
	ts   *ast.TypeSpec
	doc  *ast.CommentGroup
	file string
	pos  int
}

type directives map[string][]string // name → argument lines, in order

func parseDirectives(groups ...*ast.CommentGroup) directives {
	d := directives{}
	for _, g := range groups {
		if g == nil {
			continue
		}
		for _, c := range g.List {
			rest, ok := strings.CutPrefix(c.Text, "//kvcm:")
			if !ok {
				continue
			}
			name, args, _ := strings.Cut(rest, " ")
			d[name] = append(d[name], strings.TrimSpace(args))
		}
	}
	return d
}

func (d directives) has(name string) bool { _, ok := d[name]; return ok }

func (d directives) one(name string) string {
	if v := d[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// kv parses "a=b c=d".
func kv(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}
	return out
}

func docText(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.TrimSpace(g.Text())
}

// renamed replaces the Go name a doc comment starts with by the C name.
func renamed(doc, goName, cName string) string {
	if rest, ok := strings.CutPrefix(doc, goName); ok && (rest == "" || rest[0] == ' ' || rest[0] == ',' || rest[0] == ':') {
		return cName + rest
	}
	return doc
}

func (l *loader) since(d directives, where string) (int, error) {
	s := d.one("since")
	if s == "" {
		return 0, fmt.Errorf("%s: missing //kvcm:since", where)
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%s: bad //kvcm:since %q", where, s)
	}
	return v, nil
}

func (l *loader) run() error {
	files := slices.Clone(l.pkg.Syntax)
	slices.SortFunc(files, func(a, b *ast.File) int {
		return strings.Compare(l.fileName(a), l.fileName(b))
	})
	var consts []*ast.ValueSpec
	constDoc := map[*ast.ValueSpec]*ast.CommentGroup{}
	for _, f := range files {
		if f.Doc != nil {
			l.m.Changes += changesSection(f.Doc.Text())
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range gd.Specs {
				doc := gd.Doc
				switch s := s.(type) {
				case *ast.TypeSpec:
					if gd.Lparen.IsValid() || s.Doc != nil {
						doc = s.Doc
					}
					l.specs = append(l.specs, typeSpec{ts: s, doc: doc, file: l.fileName(f), pos: l.pkg.Fset.Position(s.Pos()).Line})
				case *ast.ValueSpec:
					if gd.Tok != token.CONST {
						continue
					}
					if gd.Lparen.IsValid() || s.Doc != nil {
						doc = s.Doc
					}
					consts = append(consts, s)
					constDoc[s] = doc
				}
			}
		}
	}
	// Pass 1: declare every named type so that references resolve.
	var funcs []typeSpec
	for _, s := range l.specs {
		d := parseDirectives(s.doc)
		name := s.ts.Name.Name
		if _, isFunc := s.ts.Type.(*ast.FuncType); isFunc && !d.has("callback") {
			funcs = append(funcs, s)
			continue
		}
		dc := &Decl{GoName: name, Doc: docText(s.doc), File: s.file, Pos: s.pos}
		switch {
		case d.has("enum"):
			dc.Kind = DEnum
		case d.has("typedef"):
			dc.Kind = DTypedef
		case d.has("handle"):
			dc.Kind = DHandle
		case d.has("callback"):
			dc.Kind = DCallback
		case d.has("opaque"):
			dc.Kind = DOpaque
		case d.has("struct"), d.has("vtable"):
			dc.Kind = DStruct
		default:
			return fmt.Errorf("%s: type %s has no //kvcm: kind directive", s.file, name)
		}
		var err error
		if dc.Since, err = l.since(d, name); err != nil {
			return err
		}
		dc.CName = l.m.Prefix + "_" + Snake(name)
		if c := d.one("cname"); c != "" {
			dc.CName = c
		}
		dc.Doc = renamed(dc.Doc, name, dc.CName)
		dc.CppName = Camel(Snake(name))
		if dc.Kind == DHandle {
			dc.CppName += "Handle"
		}
		if c := d.one("cpp"); c != "" {
			dc.CppName = c
		}
		dc.CppAliases = d["cppalias"]
		dc.CppNamespace = d.one("cppns")
		dc.Versioned = d.has("versioned")
		dc.Vtable = d.has("vtable")
		for _, g := range slices.Sorted(slices.Values(d["goimpl"])) {
			name, typ, _ := strings.Cut(g, " ")
			gm, err := parseGoMap("out " + typ)
			if err != nil {
				return fmt.Errorf("%s: bad //kvcm:goimpl %q: want \"<impl> <import path>.<Type>\"", dc.GoName, g)
			}
			dc.GoImpls = append(dc.GoImpls, &GoImpl{Impl: name, GoMap: gm})
		}
		if len(dc.GoImpls) > 0 && !dc.Vtable {
			return fmt.Errorf("%s: //kvcm:goimpl on a type that is not a //kvcm:vtable", dc.GoName)
		}
		if g := d.one("gohandle"); g != "" {
			var ok bool
			if dc.GoHandle, dc.GoHandleWhat, ok = strings.Cut(g, " "); !ok || dc.Kind != DHandle {
				return fmt.Errorf("%s: bad //kvcm:gohandle %q: want \"<Go type> <words>\" on a //kvcm:handle", dc.GoName, g)
			}
		}
		if g := d.one("gomodel"); g != "" {
			if dc.GoModel, err = parseGoMap("out " + g); err != nil || dc.GoHandle == "" {
				return fmt.Errorf("%s: bad //kvcm:gomodel %q: want \"<import path>.<Type>\" on a //kvcm:gohandle", dc.GoName, g)
			}
		}
		if g := d.one("go"); g != "" {
			if dc.GoMap, err = parseGoMap(g); err != nil || dc.Kind != DStruct {
				return fmt.Errorf("%s: bad //kvcm:go %q: want \"in|out|inout <import path>.<Type>\" on a //kvcm:struct", dc.GoName, g)
			}
		}
		if g := d.one("gocaller"); g != "" {
			if dc.GoCaller, err = parseGoMap("out " + g); err != nil || !dc.Vtable && dc.Kind != DCallback {
				return fmt.Errorf("%s: bad //kvcm:gocaller %q: want \"<import path>.<Type>\" on a //kvcm:vtable or //kvcm:callback", dc.GoName, g)
			}
		}
		if dc.CppImpl = d.has("cppimpl"); dc.CppImpl && !dc.Vtable {
			return fmt.Errorf("%s: //kvcm:cppimpl on a type that is not a //kvcm:vtable", dc.GoName)
		}
		if dc.PyValue = d.has("pyvalue"); dc.PyValue && dc.Kind != DStruct {
			return fmt.Errorf("%s: //kvcm:pyvalue on a type that is not a //kvcm:struct", dc.GoName)
		}
		if dc.PyValue {
			if err := parsePyValue(dc, d.one("pyvalue")); err != nil {
				return fmt.Errorf("%s: bad //kvcm:pyvalue %q: %w", dc.GoName, d.one("pyvalue"), err)
			}
		}
		if d.has("cppvalue") {
			if dc.CppValue, err = parseValueType(d, "cppvalue", "cpp"); err != nil || dc.Kind != DStruct {
				return fmt.Errorf("%s: bad //kvcm:cppvalue %q: want \"<C++ name> [order=a,b,...] [out] [arg]\" on a //kvcm:struct (%v)", dc.GoName, d.one("cppvalue"), err)
			}
		}
		if d.has("pyconfig") {
			if dc.PyConfig, err = parseValueType(d, "pyconfig", "py"); err != nil || dc.Kind != DStruct {
				return fmt.Errorf("%s: bad //kvcm:pyconfig %q: want \"<Python name> [order=a,b,...]\" on a //kvcm:struct (%v)", dc.GoName, d.one("pyconfig"), err)
			}
		}
		for _, line := range d["pyvariant"] {
			v, err := parsePyVariant(line)
			if err != nil || dc.Kind != DStruct {
				return fmt.Errorf("%s: bad //kvcm:pyvariant %q: want \"<Name> <enum field>=<member> fields=a[=default],...\" on a //kvcm:struct (%v)", dc.GoName, line, err)
			}
			dc.PyVariants = append(dc.PyVariants, v)
		}
		for _, line := range d["pyvariantfield"] {
			if err := parsePyVariantField(dc, line); err != nil {
				return fmt.Errorf("%s: bad //kvcm:pyvariantfield %q: %w", dc.GoName, line, err)
			}
		}
		dc.Status = d.has("status")
		dc.APITable = d.has("apitable")
		if a := d.one("align"); a != "" {
			if dc.Align, err = strconv.Atoi(a); err != nil || dc.Align < 1 || dc.Align&(dc.Align-1) != 0 {
				return fmt.Errorf("%s: //kvcm:align %q is not a power of two", dc.GoName, a)
			}
		}
		if e := kv(d.one("enum")); dc.Kind == DEnum {
			if e["cpp"] != "" {
				dc.CppName = e["cpp"]
			}
			dc.CppBase = e["cppbase"]
			l.enumOpts[name] = e
			if d.has("gocodes") {
				if dc.GoCodes = d.one("gocodes"); dc.GoCodes == "" {
					return fmt.Errorf("%s: //kvcm:gocodes needs a prefix", dc.GoName)
				}
			}
			if p := strings.Fields(d.one("pyenum")); len(p) > 0 {
				dc.PyEnum, dc.PyEnumNames = p[0], map[string]string{}
				for _, r := range p[1:] {
					for _, kv := range strings.Split(r, ",") {
						from, to, ok := strings.Cut(kv, "=")
						if !ok || from == "" || to == "" {
							return fmt.Errorf("%s: bad //kvcm:pyenum renaming %q: want <member>=<name>", dc.GoName, kv)
						}
						dc.PyEnumNames[from] = to
					}
				}
			}
		} else if d.has("pyenum") || d.has("gocodes") {
			return fmt.Errorf("%s: //kvcm:pyenum and //kvcm:gocodes are for a //kvcm:enum", dc.GoName)
		}
		l.m.byGo[name] = dc
		l.m.Decls = append(l.m.Decls, dc)
	}
	// Pass 2: bodies.
	for _, s := range l.specs {
		dc := l.m.byGo[s.ts.Name.Name]
		if dc == nil {
			continue
		}
		if err := l.body(dc, s); err != nil {
			return err
		}
	}
	for _, vs := range consts {
		if err := l.constSpec(vs, constDoc[vs]); err != nil {
			return err
		}
	}
	for _, dc := range l.m.Decls {
		for from := range dc.PyEnumNames {
			if !slices.ContainsFunc(dc.Members, func(e *EnumMember) bool { return e.PyName == from }) {
				return fmt.Errorf("%s: //kvcm:pyenum renames %s, not a member (its Python names: %s)", dc.GoName, from, strings.Join(pyMemberNames(dc), ", "))
			}
		}
	}
	for _, s := range funcs {
		f, err := l.function(s)
		if err != nil {
			return err
		}
		l.m.Funcs = append(l.m.Funcs, f)
	}
	slices.SortFunc(l.m.Funcs, func(a, b *Func) int { return strings.Compare(a.CName, b.CName) })
	for _, d := range l.m.Decls {
		slices.SortStableFunc(d.Members, func(a, b *EnumMember) int { return cmpInt(a.Value, b.Value) })
	}
	if err := l.order(); err != nil {
		return err
	}
	return l.checkABIVersion()
}

// checkABIVersion checks that the ABIVersion constant, when the description
// declares one, is at least the newest version any declaration appeared in:
// the header must not advertise an older version than the layouts it has.
func (l *loader) checkABIVersion() error {
	for _, c := range l.m.Consts {
		if c.GoName != "ABIVersion" || c.Str {
			continue
		}
		v, err := strconv.Atoi(c.Value)
		if err != nil {
			return fmt.Errorf("ABIVersion: bad value %q", c.Value)
		}
		if n := l.m.MaxSince(); v < n {
			return fmt.Errorf("ABIVersion is %d, but declarations appeared in ABI version %d", v, n)
		}
	}
	return nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (l *loader) fileName(f *ast.File) string {
	return filepath.Base(l.pkg.Fset.File(f.Pos()).Name())
}

func (l *loader) body(dc *Decl, s typeSpec) error {
	obj := l.pkg.TypesInfo.Defs[s.ts.Name].(*types.TypeName)
	under := obj.Type().Underlying()
	switch dc.Kind {
	case DEnum, DTypedef, DHandle:
		t, err := l.convert(under, dc.GoName)
		if err != nil {
			return err
		}
		if t.Kind != KScalar && t.Kind != KSize {
			return fmt.Errorf("%s: enum, typedef and handle types must be scalars", dc.GoName)
		}
		dc.Base = t
	case DCallback:
		sig, err := l.signature(under.(*types.Signature), s.ts.Type.(*ast.FuncType), dc.GoName)
		if err != nil {
			return err
		}
		dc.Callback = sig
	case DStruct:
		st, ok := s.ts.Type.(*ast.StructType)
		if !ok {
			return fmt.Errorf("%s: //kvcm:struct on a non-struct", dc.GoName)
		}
		if dc.Versioned {
			dc.Fields = append(dc.Fields,
				&Field{GoName: "StructSize", CName: "struct_size", Type: &Type{Kind: KScalar, Scalar: "uint32_t"}, Since: dc.Since,
					Doc: "Set to sizeof(" + dc.CName + "): the library reads only the fields it covers."},
				&Field{GoName: "ABIVersion", CName: "abi_version", Type: &Type{Kind: KScalar, Scalar: "uint32_t"}, Since: dc.Since,
					Doc: "Set to KVCM_ABI_VERSION, the version of the header the caller was built with."})
		}
		tstruct := under.(*types.Struct)
		i := 0
		for _, af := range st.Fields.List {
			for _, name := range af.Names {
				tf := tstruct.Field(i)
				tag := reflect.StructTag(tstruct.Tag(i))
				i++
				where := dc.GoName + "." + name.Name
				var t *Type
				var err error
				if sig, ok := tf.Type().(*types.Signature); ok {
					var sg *Sig
					sg, err = l.signature(sig, af.Type.(*ast.FuncType), where)
					t = &Type{Kind: KFunc, Sig: sg}
				} else {
					t, err = l.convert(tf.Type(), where)
				}
				if err != nil {
					return err
				}
				f := &Field{GoName: name.Name, CName: Snake(name.Name), Type: t, Doc: docText(af.Doc), Since: dc.Since,
					Nullable: tag.Get("nullable") == "true", Own: tag.Get("own"), Go: tag.Get("go"), Cpp: tag.Get("cpp"), Fail: tag.Get("fail"),
					CppDefault: tag.Get("cppdefault"), Path: tag.Get("path"), Py: tag.Get("py"), PyDefault: tag.Get("pydefault"), PyType: tag.Get("pytype"), User: Snake(tag.Get("user"))}
				if c := tag.Get("c"); c != "" {
					f.CName = c
				}
				if v := tag.Get("sized"); v != "" {
					if err := sizedSlotParam(f, v); err != nil {
						return fmt.Errorf("%s: %w", where, err)
					}
				}
				if v := tag.Get("since"); v != "" {
					if f.Since, err = strconv.Atoi(v); err != nil || f.Since < 1 {
						return fmt.Errorf("%s: bad since tag %q", where, v)
					}
				}
				if n := tag.Get("len"); n != "" {
					f.Len = Snake(n)
				}
				f.Doc = renamed(f.Doc, f.GoName, f.CName)
				dc.Fields = append(dc.Fields, f)
			}
		}
		if i != tstruct.NumFields() {
			return fmt.Errorf("%s: embedded fields are not supported", dc.GoName)
		}
		if err := checkFieldVersions(dc); err != nil {
			return err
		}
		if err := checkGoImpls(dc); err != nil {
			return err
		}
		if dc.CppImpl {
			if err := checkCppImpl(dc); err != nil {
				return err
			}
		}
		if dc.PyValue {
			if _, err := pyValueFields(dc); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkFieldVersions enforces the append-only rule of struct layouts. A
// field cannot predate its struct. A struct without struct_size (not
// versioned) is frozen when it appears: the library cannot tell a caller
// built against an older header from a newer one, so every field has the
// struct's version (extending one means a new type). A versioned struct
// only ever gains fields at its end: its fields are in non-decreasing
// version order, so that a released offset never moves.
func checkFieldVersions(dc *Decl) error {
	prev := dc.Since
	for _, f := range dc.Fields {
		where := dc.GoName + "." + f.GoName
		switch {
		case f.Since < dc.Since:
			return fmt.Errorf("%s: field since ABI version %d is older than its struct (since %d)", where, f.Since, dc.Since)
		case !dc.Versioned && f.Since != dc.Since:
			return fmt.Errorf("%s: field since ABI version %d added to %s (since %d), which is not versioned: "+
				"a struct without struct_size cannot grow (declare a new type, or make the struct //kvcm:versioned before its first release)",
				where, f.Since, dc.GoName, dc.Since)
		case f.Since < prev:
			return fmt.Errorf("%s: field since ABI version %d follows a field since version %d: "+
				"fields are append-only, a later version's fields go after every earlier one's", where, f.Since, prev)
		}
		prev = f.Since
	}
	return nil
}

func (l *loader) constSpec(vs *ast.ValueSpec, doc *ast.CommentGroup) error {
	d := parseDirectives(doc)
	for _, name := range vs.Names {
		c := l.pkg.TypesInfo.Defs[name].(*types.Const)
		if named, ok := c.Type().(*types.Named); ok {
			dc := l.m.byGo[named.Obj().Name()]
			if dc == nil || dc.Kind != DEnum {
				return fmt.Errorf("constant %s: type %s is not an enum", name.Name, named.Obj().Name())
			}
			v, _ := strconv.ParseInt(c.Val().ExactString(), 10, 64)
			opts := l.enumOpts[dc.GoName]
			trimmed := strings.TrimPrefix(name.Name, opts["trim"])
			mem := &EnumMember{GoName: name.Name, Trimmed: trimmed, Value: v, Doc: docText(doc), Since: dc.Since,
				CName:   opts["cprefix"] + strings.ToUpper(Snake(trimmed)),
				CppName: "k" + Camel(Snake(trimmed)),
				PyName:  strings.ToUpper(Snake(trimmed))}
			if trimmed == "OK" {
				mem.PyName, mem.CppName = "OK", "kOk"
			}
			if cn := d.one("cname"); cn != "" {
				mem.CName = cn
			}
			mem.Doc = renamed(mem.Doc, name.Name, mem.CName)
			if d.one("since") != "" {
				var err error
				if mem.Since, err = l.since(d, dc.GoName+"."+name.Name); err != nil {
					return err
				}
			}
			dc.Members = append(dc.Members, mem)
			continue
		}
		since, err := l.since(d, name.Name)
		if err != nil {
			return err
		}
		k := &Const{GoName: name.Name, CName: strings.ToUpper(l.m.Prefix + "_" + Snake(name.Name)), Doc: docText(doc), Since: since}
		if cn := d.one("cname"); cn != "" {
			k.CName = cn
		}
		k.Doc = renamed(k.Doc, name.Name, k.CName)
		b := c.Type().Underlying().(*types.Basic)
		if b.Info()&types.IsString != 0 {
			k.Str, k.Value = true, constantString(c)
		} else {
			t, err := l.convert(c.Type(), name.Name)
			if err != nil {
				return err
			}
			k.Type, k.Value = t, c.Val().ExactString()
		}
		l.m.Consts = append(l.m.Consts, k)
	}
	return nil
}

func constantString(c *types.Const) string {
	s, _ := strconv.Unquote(c.Val().ExactString())
	return s
}

func (l *loader) function(s typeSpec) (*Func, error) {
	d := parseDirectives(s.doc)
	name := s.ts.Name.Name
	since, err := l.since(d, name)
	if err != nil {
		return nil, err
	}
	obj := l.pkg.TypesInfo.Defs[s.ts.Name].(*types.TypeName)
	sig, err := l.signature(obj.Type().Underlying().(*types.Signature), s.ts.Type.(*ast.FuncType), name)
	if err != nil {
		return nil, err
	}
	f := &Func{GoName: name, CName: l.m.Prefix + "_" + Snake(name), Doc: docText(s.doc), Since: since,
		Thread: d.one("thread"), Impl: d.one("impl"), Sig: sig, Returns: d.one("returns"), Call: d.one("call")}
	if c := d.one("cname"); c != "" {
		f.CName = c
	}
	f.Doc = renamed(f.Doc, name, f.CName)
	if f.Impl == "" {
		f.Impl = "go"
	}
	if f.Thread == "" {
		return nil, fmt.Errorf("%s: missing //kvcm:thread", name)
	}
	if _, ok := threadDocs[f.Thread]; !ok {
		return nil, fmt.Errorf("%s: unknown //kvcm:thread %q", name, f.Thread)
	}
	byName := map[string]*Param{}
	for _, p := range sig.Params {
		byName[p.GoName] = p
	}
	for _, line := range d["param"] {
		fields := strings.SplitN(line, " ", 3)
		if len(fields) < 2 {
			return nil, fmt.Errorf("%s: bad //kvcm:param %q", name, line)
		}
		p := byName[fields[0]]
		if p == nil {
			return nil, fmt.Errorf("%s: //kvcm:param names unknown parameter %q", name, fields[0])
		}
		for _, fl := range strings.Split(fields[1], ",") {
			if n, ok := strings.CutPrefix(fl, "len="); ok {
				if byName[n] == nil {
					return nil, fmt.Errorf("%s: %s: len names unknown parameter %q", name, p.GoName, n)
				}
				p.Len = Snake(n)
				continue
			}
			if g, ok := strings.CutPrefix(fl, "go="); ok {
				p.GoElem = g
				continue
			}
			if t, ok := strings.CutPrefix(fl, "into="); ok {
				q, field, ok := strings.Cut(t, ".")
				if !ok || byName[q] == nil || field == "" {
					return nil, fmt.Errorf("%s: %s: into=%s: want into=<parameter>.<Go field>", name, p.GoName, t)
				}
				p.Into, p.IntoField = Snake(q), field
				continue
			}
			if t, ok := strings.CutPrefix(fl, "of="); ok {
				q, field, ok := strings.Cut(t, ".")
				if !ok || byName[q] == nil || field == "" {
					return nil, fmt.Errorf("%s: %s: of=%s: want of=<buffer parameter>.<C field>", name, p.GoName, t)
				}
				p.Of, p.OfField = Snake(q), field
				continue
			}
			if t, ok := strings.CutPrefix(fl, "column="); ok {
				q, field, ok := strings.Cut(t, ".")
				switch {
				case !ok && t != "":
					p.Column = t
				case ok && byName[q] != nil && field != "":
					p.ColumnOf, p.Column = Snake(q), field
				default:
					return nil, fmt.Errorf("%s: %s: column=%s: want column=<Go field> on a buffer, column=<buffer parameter>.<Go field> on its other columns", name, p.GoName, t)
				}
				continue
			}
			if n, ok := strings.CutPrefix(fl, "buffer="); ok {
				if byName[n] == nil {
					return nil, fmt.Errorf("%s: %s: buffer names unknown parameter %q", name, p.GoName, n)
				}
				p.Buffer = Snake(n)
				continue
			}
			switch fl {
			case "in", "out", "borrowed", "owned", "consumed", "nullable", "string", "slice", "short", "result", "reset", "take", "convert", "nullnil", "sized":
			default:
				return nil, fmt.Errorf("%s: %s: unknown flag %q", name, p.GoName, fl)
			}
			p.Flags = append(p.Flags, fl)
		}
		p.Nullable = p.Has("nullable")
		if len(fields) == 3 {
			p.Doc = fields[2]
		}
	}
	for _, p := range sig.Params {
		if p.Doc == "" {
			return nil, fmt.Errorf("%s: parameter %s has no //kvcm:param", name, p.GoName)
		}
		if err := checkConvention(f, p); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", name, p.GoName, err)
		}
	}
	return f, nil
}

func (l *loader) signature(sig *types.Signature, ft *ast.FuncType, where string) (*Sig, error) {
	out := &Sig{Result: &Type{Kind: KVoid}}
	for i := range sig.Params().Len() {
		v := sig.Params().At(i)
		if v.Name() == "" || v.Name() == "_" {
			return nil, fmt.Errorf("%s: every parameter needs a name", where)
		}
		t, err := l.convert(v.Type(), where+"("+v.Name()+")")
		if err != nil {
			return nil, err
		}
		out.Params = append(out.Params, &Param{GoName: v.Name(), CName: Snake(v.Name()), Type: t})
	}
	// A const char* followed by a size_t named after it plus "Len" is a
	// length-delimited byte string (vtable slots and callbacks have no
	// //kvcm:param lines to say so).
	for i, p := range out.Params[:max(0, len(out.Params)-1)] {
		if n := out.Params[i+1]; p.Type.Kind == KCStr && n.Type.Kind == KSize && n.GoName == p.GoName+"Len" {
			p.Len = n.CName
		}
	}
	switch sig.Results().Len() {
	case 0:
	case 1:
		t, err := l.convert(sig.Results().At(0).Type(), where+" result")
		if err != nil {
			return nil, err
		}
		out.Result = t
	default:
		return nil, fmt.Errorf("%s: multi-value results are not allowed in the ABI", where)
	}
	_ = ft
	return out, nil
}

var scalars = map[types.BasicKind]string{
	types.Int8: "int8_t", types.Int16: "int16_t", types.Int32: "int32_t", types.Int64: "int64_t",
	types.Uint8: "uint8_t", types.Uint16: "uint16_t", types.Uint32: "uint32_t", types.Uint64: "uint64_t",
	types.Float32: "float", types.Float64: "double", types.Bool: "bool", types.Uintptr: "uintptr_t",
}

func (l *loader) convert(t types.Type, where string) (*Type, error) {
	switch t := t.(type) {
	case *types.Basic:
		if s, ok := scalars[t.Kind()]; ok {
			return &Type{Kind: KScalar, Scalar: s}, nil
		}
		return nil, fmt.Errorf("%s: type %s is not fixed-width (use int32, int64, ...)", where, t)
	case *types.Pointer:
		el, err := l.convert(t.Elem(), where)
		if err != nil {
			return nil, err
		}
		if el.Kind != KNamed || !el.Decl.Status {
			return nil, fmt.Errorf("%s: Go pointers are only allowed for the status result (use spec.In/Out)", where)
		}
		return &Type{Kind: KPtr, Elem: el, Dir: DirOut}, nil
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && obj.Pkg().Path() == SpecPath {
			switch obj.Name() {
			case "Size":
				return &Type{Kind: KSize}, nil
			case "CStr":
				return &Type{Kind: KCStr}, nil
			case "VoidPtr":
				return &Type{Kind: KVoidPtr}, nil
			case "ConstVoidPtr":
				return &Type{Kind: KConstVoidPtr}, nil
			case "In", "Out", "InOut":
				el, err := l.convert(t.TypeArgs().At(0), where)
				if err != nil {
					return nil, err
				}
				dir := map[string]Dir{"In": DirIn, "Out": DirOut, "InOut": DirInOut}[obj.Name()]
				return &Type{Kind: KPtr, Elem: el, Dir: dir}, nil
			}
			return nil, fmt.Errorf("%s: unknown marker spec.%s", where, obj.Name())
		}
		if obj.Pkg() != nil && obj.Pkg().Path() == l.pkg.PkgPath {
			if d := l.m.byGo[obj.Name()]; d != nil {
				return &Type{Kind: KNamed, Decl: d}, nil
			}
			return nil, fmt.Errorf("%s: type %s is not an ABI type (add a //kvcm: directive)", where, obj.Name())
		}
		return nil, fmt.Errorf("%s: type %s from another package", where, t)
	}
	return nil, fmt.Errorf("%s: unsupported type %s", where, t)
}

// order sorts declarations: dependencies first (a struct after every struct
// it embeds by value, every callback after the types its signature names),
// otherwise by kind then name, and computes struct layouts.
func (l *loader) order() error {
	rank := map[DeclKind]int{DTypedef: 0, DHandle: 0, DEnum: 1, DOpaque: 2, DCallback: 3, DStruct: 4}
	decls := slices.Clone(l.m.Decls)
	slices.SortStableFunc(decls, func(a, b *Decl) int {
		if r := rank[a.Kind] - rank[b.Kind]; r != 0 {
			return r
		}
		return strings.Compare(a.CName, b.CName)
	})
	var out []*Decl
	state := map[*Decl]int{}
	var visit func(d *Decl) error
	visit = func(d *Decl) error {
		switch state[d] {
		case 1:
			return fmt.Errorf("type %s: cycle of by-value struct fields", d.GoName)
		case 2:
			return nil
		}
		state[d] = 1
		for _, f := range d.Fields {
			if f.Type.Kind == KNamed && f.Type.Decl.Kind == DStruct {
				if err := visit(f.Type.Decl); err != nil {
					return err
				}
			}
		}
		state[d] = 2
		if d.Kind == DStruct {
			d.layout()
		}
		out = append(out, d)
		return nil
	}
	for _, d := range decls {
		if err := visit(d); err != nil {
			return err
		}
	}
	l.m.Decls = out
	return nil
}

// changesSection returns the text under the "# Changes" heading of a package
// doc, up to the next heading.
func changesSection(doc string) string {
	const heading = "# Changes\n"
	i := strings.Index("\n"+doc, "\n"+heading)
	if i < 0 {
		return ""
	}
	rest := doc[i+len(heading):]
	if j := strings.Index(rest, "\n# "); j >= 0 {
		rest = rest[:j]
	}
	return strings.TrimSpace(rest)
}

// sizedSlotParam applies a slot's sized:"<param>=<count>" tag: the T*
// parameter param (T a scalar) holds as many elements as the size_t
// parameter count says (get_allocation_priority's order, of
// num_request_ids elements).
func sizedSlotParam(f *Field, tag string) error {
	name, count, _ := strings.Cut(tag, "=")
	if f.Type.Kind != KFunc {
		return fmt.Errorf("a sized tag is for a vtable slot")
	}
	var p, n *Param
	for _, q := range f.Type.Sig.Params {
		switch q.GoName {
		case name:
			p = q
		case count:
			n = q
		}
	}
	if p == nil || n == nil || p.Type.Kind != KPtr || p.Type.Dir != DirOut || !isScalarField(p.Type.Elem) || n.Type.Kind != KSize {
		return fmt.Errorf("sized:%q: want <T* parameter>=<size_t parameter>", tag)
	}
	p.Len = n.CName
	return nil
}

// checkGoImpls checks what a Go implementation of a vtable needs: every slot
// after struct_size and abi_version is a function taking self first, and
// every implementation name is a C identifier.
func checkGoImpls(dc *Decl) error {
	for _, g := range dc.GoImpls {
		impl := g.Impl
		if impl == "" || strings.IndexFunc(impl, func(r rune) bool { return !(r == '_' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9') }) >= 0 {
			return fmt.Errorf("%s: //kvcm:goimpl %q: want a lower-case C identifier", dc.GoName, impl)
		}
	}
	if len(dc.GoImpls) == 0 {
		return nil
	}
	for _, f := range dc.Fields {
		if f.CName == "struct_size" || f.CName == "abi_version" {
			continue
		}
		if f.Type.Kind != KFunc || len(f.Type.Sig.Params) == 0 || f.Type.Sig.Params[0].Type.Kind != KVoidPtr {
			return fmt.Errorf("%s.%s: a vtable with //kvcm:goimpl has only slots that take self (void*) first", dc.GoName, f.GoName)
		}
	}
	return nil
}

// paramOf returns the parameter of f with the C name.
func paramOf(f *Func, cName string) *Param {
	for _, p := range f.Sig.Params {
		if p.CName == cName {
			return p
		}
	}
	return nil
}

// fieldOf returns the field of d with the C name, or nil.
func fieldOf(d *Decl, cName string) *Field {
	for _, f := range d.Fields {
		if f.CName == cName {
			return f
		}
	}
	return nil
}

// checkConvention checks a parameter's string, slice and buffer flags.
func checkConvention(f *Func, p *Param) error {
	t := p.Type
	if p.Has("result") {
		switch {
		case !f.Sig.Result.IsStatus():
			return fmt.Errorf("result needs a kvcm_status* result")
		case t.Kind != KPtr || t.Dir != DirOut || p.Len != "":
			return fmt.Errorf("result is for a T* without len=")
		case !isScalarField(t.Elem) && (t.Elem.Kind != KNamed || t.Elem.Decl.GoMap == nil || !t.Elem.Decl.GoMap.Out):
			return fmt.Errorf("result is for a scalar, or a struct with //kvcm:go out")
		}
	}
	if p.Buffer != "" && p.Of == "" {
		for _, q := range f.Sig.Params {
			if q != p && q.Buffer != "" && q.Of == "" {
				return fmt.Errorf("a function has one buffer (others are its nested buffers, of=)")
			}
		}
	}
	if p.Into != "" {
		q := paramOf(f, p.Into)
		switch {
		case !isScalarField(t) || p.Len != "":
			return fmt.Errorf("into is for a scalar")
		case !q.Has("convert") || q.Len != "":
			return fmt.Errorf("into names %s, which is not a convert parameter without len=", q.CName)
		}
	}
	if p.Of != "" {
		q := paramOf(f, p.Of)
		if t.Kind != KPtr || t.Dir != DirOut || p.Len == "" {
			return fmt.Errorf("of is for a T* with len=")
		}
		if q.Buffer == "" || q.Of != "" || q.Type.Kind != KPtr || q.Type.Elem.Kind != KNamed || q.Type.Elem.Decl.Kind != DStruct {
			return fmt.Errorf("of names %s, which is not a buffer of structs", q.CName)
		}
		fd := fieldOf(q.Type.Elem.Decl, p.OfField)
		if fd == nil || fd.Type.Kind != KPtr || fd.Len == "" || fd.Type.Elem.CName() != t.Elem.CName() {
			return fmt.Errorf("of=%s.%s: %s has no array field %s of %s", q.GoName, p.OfField, q.Type.Elem.Decl.CName, p.OfField, t.Elem.CName())
		}
	}
	if p.Column != "" {
		switch {
		case t.Kind != KPtr || t.Dir != DirOut || p.Len == "" || !isScalarField(t.Elem):
			return fmt.Errorf("column is for a T* of scalars with len=")
		case p.ColumnOf == "" && (p.Buffer == "" || p.GoElem == "" || p.Has("reset") || p.Of != ""):
			return fmt.Errorf("column=<Go field> is for a buffer= with go=<Go struct>, without reset or of=")
		}
		if p.ColumnOf != "" {
			q := paramOf(f, p.ColumnOf)
			if q.Buffer == "" || q.Column == "" || q.ColumnOf != "" || q.Len != p.Len || p.Buffer != "" {
				return fmt.Errorf("column=%s.%s: %s is not a buffer= with column= and len=%s", q.GoName, p.Column, q.CName, p.Len)
			}
		}
	}
	if p.Has("sized") {
		switch {
		case !f.Sig.Result.IsStatus():
			return fmt.Errorf("sized needs a kvcm_status* result")
		case t.Kind != KPtr || t.Dir != DirOut || p.Len == "" || p.Buffer != "":
			return fmt.Errorf("sized is for a T* with len= and no buffer=")
		case p.GoElem == "" && (t.Elem.Kind != KNamed || t.Elem.Decl.GoMap == nil || !t.Elem.Decl.GoMap.Out):
			return fmt.Errorf("sized needs go=<Go element type>, or elements with //kvcm:go out")
		}
	}
	if p.Has("convert") {
		switch {
		case !f.Sig.Result.IsStatus():
			return fmt.Errorf("convert needs a kvcm_status* result")
		case t.Kind != KPtr || t.Dir != DirIn || p.Has("consumed") || (p.Nullable && p.Len == ""):
			return fmt.Errorf("convert is for a const T*, not consumed, nullable only with len=")
		case t.Elem.Kind != KNamed || t.Elem.Decl.GoMap == nil || !t.Elem.Decl.GoMap.In:
			return fmt.Errorf("convert is for a struct with //kvcm:go in")
		}
	}
	if p.Has("nullnil") && (!p.Has("slice") || !p.Nullable) {
		return fmt.Errorf("nullnil is for a nullable slice")
	}
	if p.Has("reset") && p.Buffer == "" {
		return fmt.Errorf("reset is for a buffer=")
	}
	if p.Has("take") {
		var nested int
		for _, q := range f.Sig.Params {
			if q.Of == p.CName {
				if q.Buffer == "" {
					return fmt.Errorf("take: the nested buffer %s needs buffer=<count>", q.CName)
				}
				nested++
			}
		}
		if p.Buffer == "" || p.Of != "" || p.Has("reset") || p.Column != "" || nested != 1 {
			return fmt.Errorf("take is for a buffer= with one nested buffer (of=), without reset or column=")
		}
	}
	conv := p.Has("string") || p.Has("slice") || p.Buffer != ""
	switch {
	case p.Has("short") && !p.Has("slice"):
		return fmt.Errorf("short is for a slice")
	case !conv:
		return nil
	case !f.Sig.Result.IsStatus():
		return fmt.Errorf("string, slice and buffer need a kvcm_status* result")
	case p.Has("string") && t.Kind != KCStr:
		return fmt.Errorf("string is for a const char*")
	case p.Len == "" && !p.Has("string"):
		return fmt.Errorf("slice and buffer need len=")
	case p.Has("slice") && (t.Kind != KPtr || t.Dir != DirIn || !isScalarField(t.Elem) || p.GoElem == ""):
		return fmt.Errorf("slice is for a const T* of scalars, with go=<Go element type>")
	case p.Buffer != "" && (t.Kind != KPtr || t.Dir != DirOut):
		return fmt.Errorf("buffer is for a T*")
	case p.Buffer != "" && p.Of == "" && p.GoElem == "" && (t.Elem.Kind != KNamed || t.Elem.Decl.GoMap == nil || !t.Elem.Decl.GoMap.Out):
		return fmt.Errorf("buffer needs go=<Go element type>, or elements with //kvcm:go out")
	}
	return nil
}

// parsePyValue reads the arguments of //kvcm:pyvalue [Name] [order=a,b,...]
// [prefix=p] [counters].
func parsePyValue(dc *Decl, args string) error {
	for i, a := range strings.Fields(args) {
		switch k, v, ok := strings.Cut(a, "="); {
		case ok && k == "order":
			dc.PyValueOrder = strings.Split(v, ",")
		case ok && k == "prefix":
			dc.PyValuePrefix = v
		case !ok && a == "counters":
			dc.PyValueCounters = true
		case !ok && i == 0:
			dc.PyValueName = a
		default:
			return fmt.Errorf("unknown argument %q (want [Name] [order=a,b,...] [prefix=p] [counters])", a)
		}
	}
	return nil
}

func parsePyVariant(line string) (*PyVariant, error) {
	args := strings.Fields(line)
	if len(args) < 3 {
		return nil, fmt.Errorf("want a name, the kind and fields=")
	}
	v := &PyVariant{Name: args[0], Defaults: map[string]string{}, Into: map[string]string{}}
	for _, a := range args[1:] {
		k, val, ok := strings.Cut(a, "=")
		switch {
		case !ok || val == "":
			return nil, fmt.Errorf("argument %q is not key=value", a)
		case k == "fields":
			for _, f := range strings.Split(val, ",") {
				name, def, _ := strings.Cut(f, "=")
				if slices.Contains(v.Fields, name) {
					return nil, fmt.Errorf("fields= names %s twice", name)
				}
				v.Fields = append(v.Fields, name)
				if def != "" {
					v.Defaults[name] = def
				}
			}
		case v.Kind == "":
			v.Kind, v.Member = k, val
		default:
			return nil, fmt.Errorf("unknown argument %q", a)
		}
	}
	if v.Kind == "" || len(v.Fields) == 0 {
		return nil, fmt.Errorf("want <enum field>=<member> and fields=")
	}
	return v, nil
}

// parsePyVariantField adds "<Variant> name type [default] into=<field> | doc"
// to its variant, declared before it.
func parsePyVariantField(dc *Decl, line string) error {
	decl, doc, _ := strings.Cut(line, " | ")
	f := strings.Fields(decl)
	if len(f) < 4 || !strings.HasPrefix(f[len(f)-1], "into=") {
		return fmt.Errorf("want \"<Variant> name type [default] into=<field> | doc\"")
	}
	i := slices.IndexFunc(dc.PyVariants, func(v *PyVariant) bool { return v.Name == f[0] })
	if i < 0 {
		return fmt.Errorf("%s is no //kvcm:pyvariant of the struct", f[0])
	}
	v := dc.PyVariants[i]
	o := &OwnField{Name: f[1], Type: f[2], Default: strings.Join(f[3:len(f)-1], " "), Doc: strings.TrimSpace(doc)}
	v.Own = append(v.Own, o)
	v.Into[o.Name] = strings.TrimPrefix(f[len(f)-1], "into=")
	return nil
}

// pyMemberNames lists the Python names of an enum's members.
func pyMemberNames(d *Decl) []string {
	var out []string
	for _, e := range d.Members {
		out = append(out, e.PyName)
	}
	return out
}
