// Package gomethodin reads a method in an in converter.
package gomethodin

// R is a rectangle's size.
//
//kvcm:struct
//kvcm:since 1
//kvcm:go in image.Rectangle
type R struct {
	// Dx is the width.
	Dx int64 `go:"Dx()"`
}
