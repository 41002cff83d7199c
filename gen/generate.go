package gen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Paths says where each output goes, relative to the output root.
type Paths struct {
	Header   string // public C header
	ShimDir  string // cgo export shim package directory
	ShimPkg  string // its Go package name
	Cpp      string // C++ declarations
	Python   string // Python ctypes layer
	Doc      string // API reference
	Include  string // the #include name of the public header
	CppGuard string
}

// DefaultPaths is kvcm's layout.
var DefaultPaths = Paths{
	Header:  "include/kvcm/kvcm.h",
	ShimDir: "capi",
	ShimPkg: "capi",
	Cpp:     "bindings/cpp/include/kvcm/kvcm_generated.hpp",
	Python:  "bindings/python/kvcm/_ffi.py",
	Doc:     "docs/api.md",
	Include: "kvcm/kvcm.h",
}

// Generate renders every output of the model, keyed by path.
func Generate(m *Model, p Paths) (map[string][]byte, error) {
	out := map[string][]byte{}
	out[p.Header] = []byte(EmitCHeader(m))
	for _, e := range emitters {
		files, err := e(m, p)
		if err != nil {
			return nil, err
		}
		for k, v := range files {
			out[k] = v
		}
	}
	return out, nil
}

// emitters beyond the header, registered by their files.
var emitters []func(*Model, Paths) (map[string][]byte, error)

// Write writes the outputs under root.
func Write(root string, files map[string][]byte) error {
	for _, name := range SortedKeys(files) {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, files[name]) {
			continue
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Check compares the outputs with the files under root and returns the
// paths that differ.
func Check(root string, files map[string][]byte) ([]string, error) {
	var diff []string
	for _, name := range SortedKeys(files) {
		old, err := os.ReadFile(filepath.Join(root, name))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		if !bytes.Equal(old, files[name]) {
			diff = append(diff, name)
		}
	}
	return diff, nil
}

// SortedKeys returns the paths in order.
func SortedKeys(files map[string][]byte) []string {
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var _ = fmt.Sprintf
