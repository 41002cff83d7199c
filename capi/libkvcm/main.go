// Command libkvcm is the main package of libkvcm.so: build it with
//
//	go build -buildmode=c-shared -o build/libkvcm.so ./capi/libkvcm
//
// (make lib does, and replaces cgo's header by include/kvcm/kvcm.h). All
// exports live in package capi.
package main

import _ "github.com/kvcm/kvcm/capi"

func main() {}
