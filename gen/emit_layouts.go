package gen

import (
	"fmt"
	"path"
	"strings"

	"github.com/dave/jennifer/jen"
)

func init() { emitters = append(emitters, emitLayouts) }

// emitLayouts writes the Go file of the ABI test package that names cgo's
// view of every struct of the header (CStructs), so that a test compares
// sizes and offsets as the C compiler laid them out with the model's.
func emitLayouts(m *Model, p Paths) (map[string][]byte, error) {
	if p.Layouts == "" {
		return nil, nil
	}
	dir := path.Dir(p.Layouts)
	f := jen.NewFile(path.Base(dir))
	f.HeaderComment(Banner)
	depth := len(strings.Split(path.Clean(dir), "/"))
	f.CgoPreamble(fmt.Sprintf("#cgo CFLAGS: -I${SRCDIR}/%s\n#include \"%s\"",
		strings.Repeat("../", depth)+path.Dir(path.Dir(p.Header)), p.Include))
	entries := jen.Dict{}
	for _, d := range m.Decls {
		if d.Kind == DStruct {
			entries[jen.Lit(d.CName)] = jen.Qual("reflect", "TypeFor").Index(jen.Qual("C", d.CName)).Call()
		}
	}
	f.Comment("CStructs returns the Go views cgo made of every struct of the header, keyed by")
	f.Comment("C name, so a test can compare their sizes and field offsets (as the C")
	f.Comment("compiler laid them out) with the generator's model.")
	f.Func().Id("CStructs").Params().Map(jen.String()).Qual("reflect", "Type").Block(
		jen.Return(jen.Map(jen.String()).Qual("reflect", "Type").Values(entries)),
	)
	var b strings.Builder
	if err := f.Render(&b); err != nil {
		return nil, fmt.Errorf("render %s: %w", p.Layouts, err)
	}
	return map[string][]byte{p.Layouts: []byte(b.String())}, nil
}
