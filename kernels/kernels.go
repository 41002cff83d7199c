// Package kernels holds kvcm's CUDA C kernels (*.cu) and the PTX generated
// from them (*.ptx), embedded for the cuda device backend and the GPU codecs,
// which load it at run time with cuModuleLoadData. Nothing here needs CUDA to
// build: the PTX is committed text.
//
// Regenerate the PTX with build_ptx.sh on a machine with nvcc (CUDA 13; see
// scripts/gpu-check.sh). Each PTX file's first line records the SHA-256 of its
// source, and this package's test fails when a source changed without its PTX
// being regenerated.
package kernels

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
)

//go:embed *.ptx
var ptxFS embed.FS

// Names of the kernel files, without extension.
const (
	// Gather is the lossless gather/scatter codec (kvcm_gather16, kvcm_gather1).
	Gather = "gather"
	// Quant is the FP8 quantizing codec (kvcm_quant_encode, kvcm_quant_decode).
	Quant = "quant"
	// Upload is the pre-CUDA-12.8 index upload (kvcm_upload_segment).
	Upload = "upload"
)

// UploadSegmentBytes is the payload of one kvcm_upload_segment launch (the
// KVCM_UPLOAD_SEGMENT of upload.cu).
const UploadSegmentBytes = 4064

// PTX returns the NUL-terminated PTX of kernel file name (Gather, Quant or
// Upload), as cuModuleLoadData wants it.
func PTX(name string) ([]byte, error) {
	b, err := ptxFS.ReadFile(name + ".ptx")
	if err != nil {
		return nil, fmt.Errorf("kernels: no PTX for %q: %w", name, err)
	}
	out := make([]byte, len(b)+1)
	copy(out, b)
	return out, nil
}

var headerRE = regexp.MustCompile(`^// kvcm-ptx source=([A-Za-z0-9_.-]+\.cu) sha256=([0-9a-f]{64})\n`)

// SourceHash parses the header line of a PTX file: the name of the source it
// was generated from and that source's SHA-256 (hex).
func SourceHash(ptx []byte) (source, sha256hex string, err error) {
	m := headerRE.FindSubmatch(ptx)
	if m == nil {
		line, _, _ := bytes.Cut(ptx, []byte("\n"))
		return "", "", fmt.Errorf("kernels: PTX header %q is not \"// kvcm-ptx source=NAME.cu sha256=HEX\"", line)
	}
	return string(m[1]), string(m[2]), nil
}
