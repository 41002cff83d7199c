package abitest

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/gen"
)

// TestLayoutsMatchTheDescription compares every struct of kvcm.h, as the C
// compiler laid it out (through cgo), with the sizes and offsets kvcmgen
// computed from the description and froze in the header's static asserts
// (which the C compiler also checked when it compiled this package).
func TestLayoutsMatchTheDescription(t *testing.T) {
	m, err := gen.Load("../..", "./gen/abi")
	require.NoError(t, err)
	got := CStructs()
	seen := 0
	for _, d := range m.Decls {
		if d.Kind != gen.DStruct {
			continue
		}
		seen++
		rt, ok := got[d.CName]
		if !assert.True(t, ok, "CStructs lacks %s", d.CName) {
			continue
		}
		assert.Equal(t, uintptr(d.Size()), rt.Size(), "sizeof(%s)", d.CName)
		if d.Align == 0 { // cgo cannot express alignas: the header's static assert checks those
			assert.Equal(t, d.Alignment(), rt.Align(), "alignof(%s)", d.CName)
		}
		n := rt.NumField()
		if n > 0 && rt.Field(n-1).Name == "_" { // cgo spells trailing padding as a field
			n--
		}
		require.Equal(t, len(d.Fields), n, "%s fields", d.CName)
		for i, f := range d.Fields {
			assert.Equal(t, f.CName, rt.Field(i).Name, "%s field %d", d.CName, i)
			assert.Equal(t, uintptr(f.Offset), rt.Field(i).Offset, "offsetof(%s, %s)", d.CName, f.CName)
		}
	}
	assert.Equal(t, len(got), seen, "every struct of the description is checked")
}

// TestPageIndexPairMatchesCore: the manager hands its []codec.PageIndexPair
// to C codecs as kvcm_page_index_pair*, so the two layouts must agree.
func TestPageIndexPairMatchesCore(t *testing.T) {
	rt := CStructs()["kvcm_page_index_pair"]
	var p codec.PageIndexPair
	assert.Equal(t, rt.Size(), unsafe.Sizeof(p))
	assert.Equal(t, 8, int(unsafe.Alignof(p)), "alignas(8), as the header asserts")
	assert.Equal(t, rt.Field(0).Offset, unsafe.Offsetof(p.Dst))
	assert.Equal(t, rt.Field(1).Offset, unsafe.Offsetof(p.Src))
}
