// Command kvcmgen generates kvcm's C header, cgo export shim, C++
// declarations, Python ctypes layer and API reference from the ABI
// description in gen/abi.
//
// Usage:
//
//	kvcmgen [-desc ./gen/abi] [-root .] [-check]
//
// With -check it writes nothing and exits 1 when any generated file differs
// from what is on disk, or when an output directory holds a file with the
// generated-file banner that kvcmgen no longer writes (the drift check of
// make generate-check). Without it, it writes the outputs and removes such
// stale files.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvcm/kvcm/gen"
)

func main() {
	desc := flag.String("desc", "./gen/abi", "the ABI description package, relative to -root")
	root := flag.String("root", ".", "the repository root the outputs are written under")
	check := flag.Bool("check", false, "compare instead of writing; exit 1 on drift")
	list := flag.Bool("list", false, "print the generated paths")
	flag.Parse()
	m, err := gen.Load(*root, *desc)
	if err != nil {
		fatal(err)
	}
	files, err := gen.Generate(m, gen.DefaultPaths)
	if err != nil {
		fatal(err)
	}
	if *list {
		for _, p := range gen.SortedKeys(files) {
			fmt.Println(p)
		}
	}
	if *check {
		diff, err := gen.Check(*root, files)
		if err != nil {
			fatal(err)
		}
		if len(diff) > 0 {
			for _, d := range diff {
				if _, ok := files[d]; ok {
					fmt.Fprintln(os.Stderr, "kvcmgen: out of date:", d)
				} else {
					fmt.Fprintln(os.Stderr, "kvcmgen: stale (no longer generated):", d)
				}
			}
			fmt.Fprintln(os.Stderr, "kvcmgen: run `make generate`")
			os.Exit(1)
		}
		return
	}
	if err := gen.Write(*root, files); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "kvcmgen:", err)
	os.Exit(1)
}
