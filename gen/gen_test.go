package gen

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// tinyPaths puts every output of the tiny description under one tree.
var tinyPaths = Paths{
	Header:    "include/kvcm/kvcm.h",
	ShimDir:   "capi",
	ShimPkg:   "capi",
	Cpp:       "cpp/kvcm_generated.hpp",
	CppValues: "cpp/kvcm_values_generated.hpp",
	Python:    "python/_ffi.py",
	PyValues:  "python/_values.py",
	PyExt:     "python/_kvcm_ext.c",
	Doc:       "docs/api.md",
	Include:   "kvcm/kvcm.h",
	Layouts:   "capi/abitest/layouts_generated.go",
}

func loadTiny(t *testing.T) *Model {
	t.Helper()
	m, err := Load("testdata/tiny", ".")
	require.NoError(t, err)
	return m
}

// TestGolden generates every output of testdata/tiny and compares it with
// testdata/golden (go test ./gen -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	files, err := Generate(loadTiny(t), tinyPaths)
	require.NoError(t, err)
	root := filepath.Join("testdata", "golden")
	if *update {
		require.NoError(t, os.RemoveAll(root))
		require.NoError(t, Write(root, files))
	}
	var want []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			want = append(want, filepath.ToSlash(rel))
		}
		return err
	}))
	assert.ElementsMatch(t, want, SortedKeys(files), "the set of generated files")
	for _, name := range SortedKeys(files) {
		golden, err := os.ReadFile(filepath.Join(root, name))
		if !assert.NoError(t, err, name) {
			continue
		}
		assert.Equal(t, string(golden), string(files[name]), "%s differs from its golden file (run with -update after checking)", name)
	}
}

func TestDeterministic(t *testing.T) {
	a, err := Generate(loadTiny(t), tinyPaths)
	require.NoError(t, err)
	b, err := Generate(loadTiny(t), tinyPaths)
	require.NoError(t, err)
	assert.Equal(t, a, b)
}

func TestEveryFileHasTheBanner(t *testing.T) {
	files, err := Generate(loadTiny(t), tinyPaths)
	require.NoError(t, err)
	for name, data := range files {
		first, _, _ := strings.Cut(string(data), "\n")
		assert.Contains(t, first, Banner, name)
	}
}

// TestKvcmDescription loads the real description: it must be complete (every
// function documented, every parameter described) and its outputs must be
// the checked-in files (the drift check make generate-check runs too).
func TestKvcmDescription(t *testing.T) {
	m, err := Load("..", "./gen/abi")
	require.NoError(t, err)
	for _, f := range m.Funcs {
		assert.NotEmpty(t, f.Doc, f.CName)
		assert.True(t, strings.HasPrefix(f.CName, "kvcm_"), f.CName)
	}
	files, err := Generate(m, DefaultPaths)
	require.NoError(t, err)
	diff, err := Check("..", files)
	require.NoError(t, err)
	assert.Empty(t, diff, "generated files are out of date: run make generate")
}

func TestModel(t *testing.T) {
	m := loadTiny(t)
	opts := m.Decl("Options")
	require.NotNil(t, opts)
	assert.Equal(t, "kvcm_options", opts.CName)
	assert.Equal(t, []string{"struct_size", "abi_version", "flag", "pairs", "num_pairs", "label", "extra"}, fieldNames(opts))
	assert.Equal(t, 48, opts.Size())
	assert.Equal(t, 40, opts.SizeV(1), "extra appeared in version 2")
	assert.Equal(t, 48, opts.SizeV(2))
	pair := m.Decl("Pair")
	assert.Equal(t, 8, pair.Alignment())
	var names []string
	for _, f := range m.TableFuncs() {
		names = append(names, f.CName)
	}
	assert.Equal(t, []string{"kvcm_count", "kvcm_status_free", "kvcm_widget_create", "kvcm_ones", "kvcm_widget_len", "kvcm_widget_move_pairs", "kvcm_widget_notify", "kvcm_widget_profile", "kvcm_widget_strips", "kvcm_widget_tag", "kvcm_widget_take_pairs", "kvcm_widget_take_strips"}, names,
		"the table is ordered by version, then name, and omits kvcm_get_api")
}

func fieldNames(d *Decl) []string {
	var out []string
	for _, f := range d.Fields {
		out = append(out, f.CName)
	}
	return out
}

func TestNames(t *testing.T) {
	for in, want := range map[string]string{
		"KVCacheCreate": "kv_cache_create", "GetAPI": "get_api", "layerGroupID": "layer_group_id",
		"ABIVersion": "abi_version", "PathGPUToHost": "path_gpu_to_host", "numGpuDescs": "num_gpu_descs",
		"ColdPageCodecVtable": "cold_page_codec_vtable", "LoraID": "lora_id", "Dst": "dst",
	} {
		assert.Equal(t, want, Snake(in), in)
	}
	assert.Equal(t, "KvCacheOptions", Camel("kv_cache_options"))
	assert.Equal(t, "LayerGroupId", Camel(Snake("LayerGroupID")))
}

func TestLoadErrors(t *testing.T) {
	for dir, want := range map[string]string{
		"multi":               "multi-value results are not allowed",
		"gostring":            "not fixed-width",
		"noparam":             "parameter v has no //kvcm:param",
		"gopointer":           "Go pointers are only allowed for the status result",
		"goimplself":          "only slots that take self (void*) first",
		"goimplmethod":        "V.Probe (//kvcm:goimpl builtin github.com/kvcm/kvcm/gen/testdata/tinygo.Plugin): want 1 parameters and 1 results, the func has 0 and 1",
		"gounmapped":          `Point has no field Z: name its counterpart with a go:"Field" tag, or tag it go:"-"`,
		"gomethodin":          "a method (go:\"Dx()\") can only be read",
		"cppimplbool":         `a trampoline returns int32_t: tag the slot cpp:"-"`,
		"pyvaluestr":          "a //kvcm:pyvalue struct has scalar, enum and typedef fields only",
		"pyvaluecounters":     "a //kvcm:pyvalue counters struct has int fields only (or a pydefault)",
		"pyvalueargs":         `unknown argument "frozen"`,
		"pyenumname":          "//kvcm:pyenum renames ONE, not a member (its Python names: ZERO)",
		"slicenogo":           "slice is for a const T* of scalars, with go=<Go element type>",
		"resetnobuffer":       "reset is for a buffer=",
		"convertnullable":     "convert is for a const T*, not consumed, nullable only with len=",
		"shortnoslice":        "short is for a slice",
		"intonoconvert":       "into names values, which is not a convert parameter without len=",
		"ofnotarray":          "of=pairs.x: kvcm_pair has no array field x of int32_t",
		"columnnobuffer":      "column=xs.Y: xs is not a buffer= with column= and len=capacity",
		"columnnofield":       "F: zs: column Z of image.Point: no such field",
		"takenonested":        "take is for a buffer= with one nested buffer (of=), without reset or column=",
		"callbacknouser":      `a callback field needs //kvcm:gocaller on Prio and a user:"Field" tag naming its user data`,
		"gocallerstructcount": "parameter 0 (pts, a structs) cannot be []github.com/kvcm/kvcm/core/layout.PoolGroupDesc",
	} {
		_, err := Load(filepath.Join("testdata", "bad", dir), ".")
		if assert.Error(t, err, dir) {
			assert.Contains(t, err.Error(), want, dir)
		}
	}
}

// make generate-check (Check) reports a generated file the generator no
// longer produces (an output renamed or dropped), which would otherwise stay
// on disk and keep being compiled (a stale *_generated.go in the cgo package
// keeps its //exports); make generate (Write) removes it. Files without the
// banner in the same directories are left alone.
func TestCheckReportsStaleGeneratedFiles(t *testing.T) {
	files, err := Generate(loadTiny(t), tinyPaths)
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, Write(root, files))
	diff, err := Check(root, files)
	require.NoError(t, err)
	require.Empty(t, diff)

	stale := filepath.Join(root, "capi", "old_exports_generated.go")
	require.NoError(t, os.WriteFile(stale, []byte("// "+Banner+"\n\npackage capi\n"), 0o644))
	diff, err = Check(root, files)
	require.NoError(t, err)
	assert.Equal(t, []string{"capi/old_exports_generated.go"}, diff, "a file with the kvcmgen banner that kvcmgen no longer writes is drift")

	handWritten := filepath.Join(root, "capi", "glue.go")
	require.NoError(t, os.WriteFile(handWritten, []byte("// Code generated by someone else; DO NOT EDIT.\n\npackage capi\n"), 0o644))
	require.NoError(t, Write(root, files))
	_, err = os.Stat(stale)
	assert.True(t, os.IsNotExist(err), "Write removes the stale generated file")
	_, err = os.Stat(handWritten)
	assert.NoError(t, err, "Write keeps files without the kvcmgen banner")
	diff, err = Check(root, files)
	require.NoError(t, err)
	assert.Empty(t, diff)
}

// A binding's value type (//kvcm:cppvalue, //kvcm:pyconfig) has every field
// of its C struct that is not tagged "-" and nothing else: kvcmgen refuses a
// field it cannot convert, an order= that does not list exactly the value
// type's fields, and a C++ name that would collide with the C struct's alias.
// A //kvcm:pyvariant names only fields of its struct or its own fields, and
// an own field goes to a field of the struct holding the array; a
// //kvcm:cppvariant fixes its enum field to one of the enum's members.
func TestValueTypeErrors(t *testing.T) {
	for dir, want := range map[string]string{
		"cppvalueorder":    `order= names "nope", not a field of the value type`,
		"pyconfigtype":     `no Python value type for void*: tag it py:"-"`,
		"cppvaluealias":    "is the name of the C struct's alias: give the struct a //kvcm:cppns",
		"pyvariantfields":  "fields= names y, neither a field of kvcm_s nor a //kvcm:pyvariantfield",
		"pyvariantinto":    "own field y: into=nope is not a field of kvcm_p",
		"cppvariantmember": "kTwo is not a member of E",
	} {
		m, err := Load(filepath.Join("testdata", "valuebad", dir), ".")
		require.NoError(t, err, dir)
		_, err = Generate(m, tinyPaths)
		if assert.Error(t, err, dir) {
			assert.Contains(t, err.Error(), want, dir)
		}
	}
}

// kvcmgen refuses a //kvcm:call whose function does not take what the
// export has to give it (the glue's arguments) or return its outputs.
func TestCallErrors(t *testing.T) {
	m, err := Load(filepath.Join("testdata", "bad", "callresults"), ".")
	require.NoError(t, err)
	_, err = Generate(m, tinyPaths)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "//kvcm:call math/bits.Add64: takes 3 arguments, the function has 1 to give it")
	}
}
