/* The bookkeeping trace's request cycle in C: the reference the Python
 * binding is measured against (bookkeeping.py compiles it at run time).
 * The same calls as the Go cycle plus one C call each, no Python in the loop. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvcm/kvcm.h"

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs num_requests requests of prompt tokens each (request r's tokens at
 * tokens + r*prompt) on manager and stream: create with prefix lookup,
 * resume, resize for the uncached tokens, commit them, steps one-token
 * decode steps (resize +1, commit 1), close. Returns CPU seconds per
 * request, or a negative value when a call failed. */
double kvcm_bench_cycle(kvcm_manager manager, kvcm_stream stream, const kvcm_token* tokens, size_t prompt,
                        size_t num_requests, int steps)
{
    const kvcm_token decode = 7;
    double t0 = cpu_seconds();
    for (size_t r = 0; r < num_requests; r++)
    {
        const kvcm_token* p = tokens + r * prompt;
        kvcm_kv_cache_options opts;
        memset(&opts, 0, sizeof opts);
        opts.struct_size = sizeof opts;
        opts.abi_version = KVCM_ABI_VERSION;
        opts.input_tokens = p;
        opts.num_input_tokens = prompt;
        kvcm_kv_cache cache = 0;
        int64_t done = 0;
        int64_t n = (int64_t)prompt;
        kvcm_status* st = kvcm_kv_cache_create(manager, &opts, &cache);
        if (!st) st = kvcm_kv_cache_resume(cache, stream);
        if (!st) st = kvcm_kv_cache_resize(cache, n, n);
        if (!st) st = kvcm_kv_cache_get_num_committed_tokens(cache, &done);
        if (!st) st = kvcm_kv_cache_commit(cache, p + done, (size_t)(n - done), false);
        for (int k = 0; !st && k < steps; k++)
        {
            st = kvcm_kv_cache_resize(cache, n + k + 1, n + k + 1);
            if (!st) st = kvcm_kv_cache_commit(cache, &decode, 1, false);
        }
        if (st)
        {
            kvcm_status_free(st);
            return -1;
        }
        st = kvcm_kv_cache_close(cache);
        if (st)
        {
            kvcm_status_free(st);
            return -1;
        }
    }
    return (cpu_seconds() - t0) / (double)num_requests;
}

/* n calls of kvcm_kv_cache_resize(cache, capacity, capacity): the C cost of a
 * scalar call, in CPU seconds per call (negative on failure). */
double kvcm_bench_resize_calls(kvcm_kv_cache cache, int64_t capacity, int n)
{
    double t0 = cpu_seconds();
    for (int i = 0; i < n; i++)
    {
        kvcm_status* st = kvcm_kv_cache_resize(cache, capacity, capacity);
        if (st)
        {
            kvcm_status_free(st);
            return -1;
        }
    }
    return (cpu_seconds() - t0) / n;
}

/* n calls of kvcm_kv_cache_get_num_committed_tokens, as above. */
double kvcm_bench_getter_calls(kvcm_kv_cache cache, int n)
{
    int64_t out = 0;
    double t0 = cpu_seconds();
    for (int i = 0; i < n; i++)
    {
        kvcm_status* st = kvcm_kv_cache_get_num_committed_tokens(cache, &out);
        if (st)
        {
            kvcm_status_free(st);
            return -1;
        }
    }
    return (cpu_seconds() - t0) / n;
}
