package gen

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ABI versioning: a released struct without struct_size keeps its layout,
// the fields of a versioned struct are append-only and no older than the
// struct, ABIVersion covers the newest version, and the header and
// docs/api.md give the version of everything.

// loadKvcm loads the real description, gen/abi.
func loadKvcm(t *testing.T) *Model {
	t.Helper()
	m, err := Load("..", "./gen/abi")
	require.NoError(t, err)
	return m
}

// frozenLayout is the released layout of a struct without struct_size.
type frozenLayout struct {
	name        string
	since       int
	size, align int
	fields      string // "name@offset ..." in declaration order
}

// frozenNonVersioned pins the layouts of the non-versioned structs of every
// released ABI version (version 1: today's). A struct without
// struct_size/abi_version cannot grow or change: the library cannot tell a
// caller built against an older header from a newer one (kvcm_cache_event,
// for one, is written as an array into a caller buffer of events_cap
// elements, so a larger sizeof overruns a caller's buffer). Extending one
// means a new struct in a new ABI version; add the entries of a version
// here when it is released.
var frozenNonVersioned = []frozenLayout{
	{"kvcm_attention_layer_config", 1, 32, 8, "layer_id@0 sliding_window_size@4 num_sink_tokens@8 buffers@16 num_buffers@24"},
	{"kvcm_batch_desc", 1, 16, 8, "requests@0 num_requests@8"},
	{"kvcm_block_stats", 1, 56, 8, "alloc_total_blocks@0 alloc_new_blocks@8 reused_blocks@16 missed_blocks@24 evictions@32 lost_pages@40 hit_rate@48"},
	{"kvcm_buffer_config", 1, 16, 8, "role@0 size@8"},
	{"kvcm_buffer_location", 1, 40, 8, "layer_group@0 pool@4 pool_base@8 scale@16 offset@24 bytes@32"},
	{"kvcm_cache_event", 1, 64, 8, "seq@0 key@8 parent@16 kind@24 layer_group@28 level@32 tokens@40 num_tokens@48 cache_id@56"},
	{"kvcm_cache_tier_config", 1, 32, 8, "kind@0 quota@8 max_quota@16 path@24"},
	{"kvcm_cold_page_codec", 1, 16, 8, "vtable@0 self@8"},
	{"kvcm_copy_desc", 1, 24, 8, "dst@0 src@8 size@16"},
	{"kvcm_cp_index_object", 1, 16, 8, "vtable@0 self@8"},
	{"kvcm_reuse_scope", 1, 24, 8, "lora_id@0 salt@8 salt_len@16"},
	{"kvcm_cp_request_id", 1, 16, 8, "data@0 len@8"},
	{"kvcm_migration_stats", 1, 24, 8, "path@0 pages@8 bytes@16"},
	{"kvcm_page_index_pair", 1, 8, 8, "dst@0 src@4"},
	{"kvcm_peak_block_stats", 1, 24, 8, "index@0 peak_used@8 total@16"},
	{"kvcm_pool_desc", 1, 16, 8, "base@0 slot_bytes@8"},
	{"kvcm_pool_group_desc", 1, 48, 8, "index@0 num_slots@8 life_cycles@16 num_life_cycles@24 pools@32 num_pools@40"},
	{"kvcm_pool_group_stats", 1, 56, 8, "level@0 tier@4 index@8 page_bytes@16 total@24 free@32 evictable@40 available@48"},
	{"kvcm_request_desc", 1, 16, 8, "capacity@0 history_length@8"},
}

func layoutOf(d *Decl) string {
	var fs []string
	for _, f := range d.Fields {
		fs = append(fs, f.CName+"@"+strconv.Itoa(f.Offset))
	}
	return strings.Join(fs, " ")
}

// TestNonVersionedStructsAreFrozen compares the non-versioned structs of
// the description with the frozen list: a released one must keep its size,
// alignment and fields, and a non-versioned struct of a released version
// that the list does not know is a struct that changed its name, its
// versioning or its version.
func TestNonVersionedStructsAreFrozen(t *testing.T) {
	m := loadKvcm(t)
	released := 0
	frozen := map[string]frozenLayout{}
	for _, f := range frozenNonVersioned {
		frozen[f.name] = f
		released = max(released, f.since)
	}
	byName := map[string]*Decl{}
	for _, d := range m.Decls {
		byName[d.CName] = d
		if d.Kind != DStruct || d.Versioned || d.Since > released {
			continue
		}
		f, ok := frozen[d.CName]
		if !assert.True(t, ok, "%s (since ABI version %d, not versioned) is not in the frozen layouts of released version %d: "+
			"a struct added to a released version (declare it since the next version instead)", d.CName, d.Since, released) {
			continue
		}
		assert.Equal(t, f.since, d.Since, "%s: since changed", d.CName)
		assert.Equal(t, f.size, d.Size(), "%s: sizeof changed from %d to %d bytes: it has no struct_size, so callers built against ABI version %d break (declare a new struct in a new ABI version)", d.CName, f.size, d.Size(), f.since)
		assert.Equal(t, f.align, d.Alignment(), "%s: alignment changed", d.CName)
		assert.Equal(t, f.fields, layoutOf(d), "%s: fields or offsets changed", d.CName)
	}
	for _, f := range frozenNonVersioned {
		d := byName[f.name]
		if assert.NotNil(t, d, "%s (frozen since ABI version %d) was removed or renamed", f.name, f.since) {
			assert.True(t, d.Kind == DStruct && !d.Versioned, "%s (frozen since ABI version %d) changed kind or became versioned", f.name, f.since)
		}
	}
}

// writeDesc writes a throw-away description package inside the module (so
// that it can import gen/spec) and returns its directory.
func writeDesc(t *testing.T, src string) string {
	t.Helper()
	dir, err := os.MkdirTemp("testdata", "desc")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "d.go"), []byte(src), 0o644))
	return dir
}

// A field of a struct that is not versioned has the struct's since: the
// loader refuses a field added in a later ABI version.
func TestLoaderRejectsFieldAddedToNonVersionedStruct(t *testing.T) {
	dir := writeDesc(t, `package d

// Event is an event.
//
//kvcm:struct
//kvcm:since 1
type Event struct {
	// Seq is the sequence number.
	Seq uint64
	// Extra appeared later.
	Extra uint64 `+"`since:\"2\"`"+`
}
`)
	_, err := Load(dir, ".")
	if assert.Error(t, err, "a field added in a later ABI version to a struct without struct_size must be rejected") {
		assert.Contains(t, err.Error(), "Event.Extra")
		assert.Contains(t, err.Error(), "not versioned")
	}
}

// A field cannot be older than its struct.
func TestLoaderRejectsFieldOlderThanStruct(t *testing.T) {
	dir := writeDesc(t, `package d

// Options are options.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 2
type Options struct {
	// Old claims version 1.
	Old uint64 `+"`since:\"1\"`"+`
}
`)
	_, err := Load(dir, ".")
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "older than its struct")
	}
}

// A versioned struct may gain fields at its end, and then the ABIVersion
// constant must cover the newest version.
func TestLoaderAcceptsAppendedFieldsAndChecksABIVersion(t *testing.T) {
	src := `package d

// ABIVersion is the version.
//
//kvcm:since 1
const ABIVersion uint32 = %d

// Options are options.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
type Options struct {
	// Old was there in version 1.
	Old uint64
	// New appeared in version 2.
	New uint64 ` + "`since:\"2\"`" + `
}
`
	m, err := Load(writeDesc(t, fmt.Sprintf(src, 2)), ".")
	require.NoError(t, err)
	assert.Equal(t, 2, m.MaxSince())
	assert.Equal(t, 16, m.Decl("Options").SizeV(1))
	_, err = Load(writeDesc(t, fmt.Sprintf(src, 1)), ".")
	if assert.Error(t, err, "ABIVersion 1 with a since-2 field") {
		assert.Contains(t, err.Error(), "ABIVersion is 1")
	}
}

// Fields are append-only: a field of version 1 after a field of version 2
// would move a released offset (and SizeV, taking the maximum end, would
// hide it); the loader refuses such a description.
func TestLoaderRejectsVersionedFieldsOutOfOrder(t *testing.T) {
	dir := writeDesc(t, `package d

// Options are options.
//
//kvcm:struct
//kvcm:versioned
//kvcm:since 1
type Options struct {
	// New appeared in version 2.
	New uint64 `+"`since:\"2\"`"+`
	// Old was there in version 1.
	Old uint64
}
`)
	_, err := Load(dir, ".")
	if assert.Error(t, err, "a since-1 field after a since-2 field breaks the frozen v1 layout and must be rejected") {
		assert.Contains(t, err.Error(), "Options.Old")
		assert.Contains(t, err.Error(), "append-only")
	}
}

// docs/api.md gives the ABI version of every handle, typedef, callback,
// opaque type and enum (like the header's "@since ABI version N"), not only
// of functions and structs; the real description is all version 1, so the
// tiny one (with a since-2 function) is checked too.
func TestDocsGiveSinceOfEveryType(t *testing.T) {
	for _, tc := range []struct {
		m     *Model
		paths Paths
	}{{loadKvcm(t), DefaultPaths}, {loadTiny(t), tinyPaths}} {
		files, err := Generate(tc.m, tc.paths)
		require.NoError(t, err)
		doc := string(files[tc.paths.Doc])
		check := func(name string, v int) {
			var entry string
			for _, line := range strings.Split(doc, "\n") {
				if strings.HasPrefix(line, "| `"+name+"` |") {
					entry = line
				}
			}
			if entry == "" {
				if i := strings.Index(doc, "### "+name+"\n"); i >= 0 {
					entry = doc[i:]
					if j := strings.Index(entry[4:], "\n### "); j >= 0 {
						entry = entry[:j+4]
					}
				}
			}
			if !assert.NotEmpty(t, entry, "%s has no entry in %s", name, tc.paths.Doc) {
				return
			}
			since := regexp.MustCompile(`ABI version ` + strconv.Itoa(v) + `\b|\| ` + strconv.Itoa(v) + ` \|`)
			assert.Regexp(t, since, entry, "%s (since ABI version %d): its docs entry does not say so", name, v)
		}
		for _, d := range tc.m.Decls {
			check(d.CName, d.Since)
		}
		for _, c := range tc.m.Consts {
			check(c.CName, c.Since)
		}
		for _, f := range tc.m.Funcs {
			check(f.CName, f.Since)
		}
	}
}

// kvcm_api is a public struct of the header (struct_size, abi_version, then
// one slot per function, append-only) that callers of kvcm_get_api index
// into: like every other struct and vtable, its layout is frozen by
// static_asserts, and docs/api.md documents its slots.
func TestAPITableLayoutIsFrozenAndDocumented(t *testing.T) {
	m := loadKvcm(t)
	files, err := Generate(m, DefaultPaths)
	require.NoError(t, err)
	header := string(files[DefaultPaths.Header])
	require.True(t, strings.Contains(header, "struct kvcm_api {"))
	assert.True(t, strings.Contains(header, "sizeof(kvcm_api) =="), "the function table's size is not frozen by a static_assert")
	assert.True(t, strings.Contains(header, "offsetof(kvcm_api, kv_cache_create) =="), "the function table's slot offsets are not frozen")

	doc := string(files[DefaultPaths.Doc])
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "| `kvcm_api` |") {
			assert.NotContains(t, line, "| opaque |", "kvcm_api has a public layout in kvcm.h; the reference calls it opaque")
		}
	}
	assert.True(t, strings.Contains(doc, "`kv_cache_create`"), "docs/api.md does not list the slots of kvcm_api")
}

// Directive values are checked: an alignment that is not a power of two is
// an error naming the type, never silently ignored.
func TestLoaderRejectsABadAlignment(t *testing.T) {
	for _, align := range []string{"eight", "0", "12"} {
		dir := writeDesc(t, `package d

// Pair is a pair.
//
//kvcm:struct
//kvcm:since 1
//kvcm:align `+align+`
type Pair struct {
	// A is a.
	A int32
	// B is b.
	B int32
}
`)
		_, err := Load(dir, ".")
		if assert.Error(t, err, "align %q", align) {
			assert.Contains(t, err.Error(), "Pair: //kvcm:align")
		}
	}
}
