// Package bookkeeping is the manager-bookkeeping benchmark of kvcm (the logic
// behind `kvcm bench bookkeeping`; EVALUATION.md §2, issue 11's trace).
//
// The trace: prompts of each size at 32 tokens a block, every other request
// sharing the first half of its prompt with the one before. Each request
// creates its cache with prefix lookup, resumes it, resizes it to the prompt
// with the whole prompt computed, commits the uncached tokens, runs
// DecodeSteps one-token decode steps (resize by one token, commit it) and
// closes. It runs without eviction (the GPU level holds everything a run
// commits) and under eviction pressure (the GPU level holds about two
// requests, so most requests evict the blocks of older ones).
//
// The trace runs once per block key of BlockKeys (config.Config.BlockKey:
// SHA-256, the default key, and XXH3 by default; -keys). For each size and
// key it prints the process CPU time per request (median of Rounds rounds,
// interleaved with the other sizes), the allocations per request, and the
// ratio of the request's CPU time to the SHA-256 hashing of the same prompt's
// blocks (blockhash.Hasher, the default key), measured in the same round:
// hashing is the irreducible work of a request with the default key.
// Then the garbage collector's share of the CPU time the Go runtime was busy
// while the requests ran (runtime/metrics: gc/total over total less idle, in
// the runtime's own accounting; median round), and the allocations per new
// block: a request's allocations over the blocks it gave a new page (prompt
// and decode steps less the reused blocks; issue 11's target 2 allows one).
//
// The decode-step table times decode steps on one cache holding each of
// HeldTokens (1k and 128k by default), for a model of full attention only and
// for one whose half of the layers have a sliding window: after 2×DecodeSteps
// untimed steps, 32 runs of DecodeSteps steps alternate between the sizes, so
// each sees the same machine. A step should cost the same whatever the cache
// holds, and the ratio to the smallest size says how close it is. Figures
// are process CPU time, so they include the garbage collector and the
// emulated device's stream workers (the benchmark's events are recorded on
// idle streams, which the emulation completes inline without waking them).
//
// `-cpuprofile FILE` writes a CPU profile of the run for go tool pprof.
//
// The manager runs on the emulated device with tiny buffers (four layers, a
// key and a value buffer of one byte a token), so the figures are the cost of
// the bookkeeping alone.
package bookkeeping
