// Package bench holds the manager's bookkeeping benchmarks (EVALUATION.md §2)
// as Go benchmarks; it has no non-test code. Run them with
//
//	go test ./core/bench -run x -bench . -benchmem
//
// They measure the manager alone: tiny buffers, an emulated device without
// delays, and no KV data written, so the figures are the cost of the
// bookkeeping (tree walks, hashing, slot and fence handling, eviction, the
// stream work the manager itself enqueues).
package bench
