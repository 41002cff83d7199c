// Package bench holds the manager's bookkeeping benchmarks (EVALUATION.md §2)
// as Go benchmarks; it has no non-test code. Run them with
//
//	go test ./internal/bench/manager -run x -bench . -benchmem
//
// The request-cycle trace of issue 11 (prompts of 1k, 8k and 32k tokens with
// decode steps, the ratio to SHA-256 hashing, the decode-step cost against
// the tokens held) is `kvcm bench bookkeeping` (internal/bench/bookkeeping,
// `make bench-bookkeeping`); these benchmarks keep the per-operation figures:
// the cycle without decode steps at 1k–128k, prefix-match time against
// prompt length, and the cost per migrated page.
//
// They measure the manager alone: tiny buffers, an emulated device without
// delays, and no KV data written, so the figures are the cost of the
// bookkeeping (tree walks, hashing, slot and fence handling, eviction, the
// stream work the manager itself enqueues).
package bench
