// Package goimplself has a Go-implemented vtable whose slot lacks self.
package goimplself

// V is a vtable.
//
//kvcm:vtable
//kvcm:goimpl builtin github.com/kvcm/kvcm/gen/testdata/tinygo.Plugin
//kvcm:since 1
type V struct {
	// Run lacks self.
	Run func(n int32) bool
}
