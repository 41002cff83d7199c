// Default AddressSanitizer options of the ASan test binary, baked in so that
// ctest, gtest test discovery and a run by hand behave the same. ASAN_OPTIONS
// in the environment is applied on top (the leak-check ctest entry sets
// detect_leaks=1 that way). libkvcm.so embeds the Go runtime and is not
// instrumented; see bindings/cpp/README.md, "AddressSanitizer".
//
//  - detect_leaks=0: LeakSanitizer only scans C/C++ roots, not memory the Go
//    runtime manages, so a C allocation referenced only from Go would be a
//    false report, and it needs to ptrace the process's own threads, which
//    some sandboxes forbid. kvcm object leaks are checked by the tests through
//    kvcm_live_handle_count; one ctest entry (cpp-asan.leak-check) still runs
//    the whole suite with LeakSanitizer on.
//  - handle_segv=0, allow_user_segv_handler=1: the Go runtime owns SIGSEGV
//    (it turns faults in Go code into panics, which the library reports as
//    KVCM_ERR_INTERNAL); ASan must neither take the signal nor refuse Go's
//    sigaction.
extern "C" const char* __asan_default_options()
{
    return "detect_leaks=0:handle_segv=0:allow_user_segv_handler=1";
}
