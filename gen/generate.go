package gen

import (
	"bytes"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
)

// Paths says where each output goes, relative to the output root.
type Paths struct {
	Header  string // public C header
	ShimDir string // cgo export shim package directory
	ShimPkg string // its Go package name
	Cpp     string // C++ declarations
	// CppValues is the C++ value types of //kvcm:cppvalue structs with
	// their conversions ("" for none).
	CppValues string
	Python    string // Python ctypes layer
	// PyValues is the Python value types of //kvcm:pyconfig structs with
	// their conversions ("" for none).
	PyValues string
	PyExt    string // CPython extension module ("" for none)
	Doc      string // API reference
	Include  string // the #include name of the public header
	CppGuard string
	Layouts  string // Go file naming cgo's view of every struct, in the ABI test package ("" for none)
}

// DefaultPaths is kvcm's layout.
var DefaultPaths = Paths{
	Header:    "include/kvcm/kvcm.h",
	ShimDir:   "capi",
	ShimPkg:   "capi",
	Cpp:       "bindings/cpp/include/kvcm/kvcm_generated.hpp",
	CppValues: "bindings/cpp/include/kvcm/kvcm_values_generated.hpp",
	Python:    "bindings/python/kvcm/_ffi.py",
	PyValues:  "bindings/python/kvcm/_values.py",
	PyExt:     "bindings/python/kvcm/_kvcm_ext.c",
	Doc:       "docs/api.md",
	Include:   "kvcm/kvcm.h",
	Layouts:   "capi/abitest/layouts_generated.go",
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

// Write writes the outputs under root and removes the stale generated files
// there (see Stale).
func Write(root string, files map[string][]byte) error {
	stale, err := Stale(root, files)
	if err != nil {
		return err
	}
	for _, name := range stale {
		if err := os.Remove(filepath.Join(root, name)); err != nil {
			return err
		}
	}
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
// paths that differ: generated files whose content differs or that are
// missing, then the stale generated files (see Stale).
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
	stale, err := Stale(root, files)
	if err != nil {
		return nil, err
	}
	return append(diff, stale...), nil
}

// Stale lists the generated files under root that the generator no longer
// produces: regular files in an output directory (the directory of any of
// files, not its subdirectories) whose first line carries the Banner but
// whose path is not in files. Such a file (an output renamed or dropped)
// would otherwise stay on disk and keep being compiled.
func Stale(root string, files map[string][]byte) ([]string, error) {
	dirs := map[string]bool{}
	for name := range files {
		dirs[path.Dir(filepath.ToSlash(name))] = true
	}
	var stale []string
	for dir := range dirs {
		entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name := path.Join(dir, e.Name())
			if !e.Type().IsRegular() {
				continue
			}
			if _, ok := files[name]; ok {
				continue
			}
			generated, err := hasBanner(filepath.Join(root, filepath.FromSlash(name)))
			if err != nil {
				return nil, err
			}
			if generated {
				stale = append(stale, name)
			}
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// hasBanner reports whether the file's first line carries the Banner.
func hasBanner(name string) (bool, error) {
	f, err := os.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 256)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return false, err
	}
	first, _, _ := bytes.Cut(buf[:n], []byte("\n"))
	return bytes.Contains(first, []byte(Banner)), nil
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
