// Package abi is the description of kvcm's C ABI: the single source of truth
// from which kvcmgen writes include/kvcm/kvcm.h, the cgo export shim in capi/,
// the C++ declarations, the Python ctypes layer and docs/api.md.
//
// Conventions of the ABI (see shared/design/ABI.md):
//
//   - Every function that can fail returns kvcm_status*: NULL means success;
//     otherwise the status carries a code and a copied message and is freed
//     with kvcm_status_free. Where the design fixes a signature (the codec's
//     bool and size_t returns) the design's convention applies.
//   - Every options struct and every vtable begins with uint32_t struct_size
//     and uint32_t abi_version. Fields are only ever appended; the library
//     reads a field only when struct_size covers it, and a vtable slot only
//     when struct_size covers it and it is non-null. Array element structs
//     (tiers, layers, buffers, requests, descriptors) are frozen: extending
//     one means a new element type and a new field in its versioned parent.
//   - Handles (kvcm_manager, kvcm_kv_cache) are opaque 64-bit values, never
//     reused within a process. 0 is never valid; a freed or consumed handle
//     is detected and reported as KVCM_ERR_INVALID_HANDLE, never
//     dereferenced. A handle type's //kvcm:gohandle <Go type> <words> names
//     the capi type behind it and the words errors call it: kvcmgen writes
//     lookup<Name>, which the exports call on every argument of the type,
//     and handleKind.
//   - Query results are written into caller-provided buffers with a count of
//     the elements needed; passing a NULL buffer with capacity 0 asks for the
//     count only.
//   - A panic inside the library becomes KVCM_ERR_INTERNAL and poisons the
//     library: every later call fails fast with KVCM_ERR_POISONED.
//   - Consumed means consumed, also on failure: a codec passed to
//     kvcm_manager_create is destroyed on every failure path.
//
// The status codes' enum carries //kvcm:gocodes code: kvcmgen writes, in
// the export package, a Go constant per member (codeInvalidArgument =
// C.KVCM_ERR_INVALID_ARGUMENT, the member's name less trim=), so a code
// added here reaches the glue with make generate.
//
// Every rule behind these functions lives in the Go package core/abimodel
// (the ABI's object model); capi only converts. Go, C, C++ and Python
// therefore follow the same rules.
//
// This package is read, never linked: its declarations only need to compile.
//
// # Structs the core carries: //kvcm:go
//
// A struct with //kvcm:go in|out <import path>.<Type> is converted to or
// from that Go struct of the core by code kvcmgen writes
// (capi/convert_generated.go: fromC<Name> for in, toC<Name> for out; see
// gen.GoMap for the rules): every field maps to the Go field of its name, or
// of the name its go:"Field" tag gives (go:"Method()" reads a method and
// go:"Field.Sub" a field of a struct field, for
// out); go:"-" leaves the field to the hand-written glue in capi. An out
// struct's array (a field with a len tag) is written from a Go slice of
// scalars, or of structs with their own //kvcm:go out: its toC<Name> takes
// a buffer for each array (see of= below). kvcmgen
// refuses a field that has neither a Go counterpart nor go:"-", so no field
// is ever silently dropped. An in converter rejects a uint64_t or size_t
// field above the largest value of its signed 64-bit Go field ("is too
// large") rather than let it turn negative.
//
// Adding a field to a configuration or statistics struct:
//
//  1. Append it to the struct here, after every existing field, with its doc
//     comment and, in a //kvcm:versioned struct, since:"N" for the ABI
//     version it appears in (an unversioned struct is frozen: add a new
//     type instead).
//  2. Give the core's Go struct (abimodel.ManagerConfig, core.BlockStats,
//     ...) a field of the same name, or tag the new field go:"TheGoName". A
//     manager configuration field that needs more than a cast (a unit, a
//     field of another Go struct) gets a field of its ABI form in
//     abimodel.ManagerConfig, which embeds config.Config, and a line in its
//     Resolve (tested in core/abimodel/config_test.go); go:"-" leaves a
//     field to the hand-written glue.
//  3. Run make generate: the C header, the converters, the C++ and Python
//     layers and docs/api.md follow. A versioned struct's new field is read
//     only when the caller's struct_size covers it (the converter checks
//     kvcm__has_<struct>_<field>), so older callers keep working.
//  4. The bindings' value types follow: a field of a //kvcm:cppvalue or
//     //kvcm:pyconfig struct appears in the C++ value type
//     (kvcm_values_generated.hpp) and the Python one (kvcm/_values.py)
//     with its conversion; give it cppdefault/pydefault where the
//     bindings' default is not zero (Python fields without pydefault are
//     required, so append one with a default), and add its binding name to
//     the struct's order= lists (kvcmgen refuses an order= that misses a
//     field, so none is dropped silently). A field the bindings carry
//     elsewhere is tagged cpp:"-" / py:"-" and set in their C form by hand
//     (detail::CConfig in kvcm.hpp, _build_c_config in manager.py). A
//     field of a //kvcm:pyvariant struct (the tier) reaches the Python
//     classes whose fields= name it (GpuCacheTierConfig, ...).
//     Statistics need nothing more: C++ uses the C structs (and the
//     //kvcm:cppvalue out types), and Python's //kvcm:pyvalue types are
//     generated (a field the Python record lacks is tagged py:"-"); the
//     hand-typed Python ones (KVCacheStatsDelta, PoolDesc/PoolGroupDesc,
//     the aggregated pages) gain the field by hand.
//
// Independent additions on different branches touch different lines (each
// field is one line with its doc), so they merge without conflicts; two
// appended to the same versioned struct only need their order settled.
//
// # Parameters the glue gets as Go values: string, slice, convert, into=, buffer=, reset, take, of=, column=, sized, result
//
// Flags of //kvcm:param make the export convert a parameter before it calls
// the glue, so that a new function taking a request id, a role, a token
// array, a configuration, a two-call buffer, nested arrays or out values
// has a one-line glue:
//
//   - string: a const char* with len= becomes a Go string (a length over
//     1 GiB is an error naming the length); without len= it is
//     NUL-terminated (NULL is rejected unless nullable, then ""); go=<Go
//     string type> casts it (the buffer roles are config.DataRole).
//   - slice with go=<Go element type>: a const T* of scalars with len=
//     becomes a []G copy, nil for none. With nullnil (on a nullable slice)
//     NULL is nil and a non-NULL array of 0 elements an empty slice, for a
//     parameter whose NULL means "unchanged". With short as well, the copy
//     of up to 8 elements is an array in the export's frame, so a glue that
//     keeps the slice makes it escape to the heap on every call: short is
//     for the hot calls whose glue does not keep it.
//   - convert: a const T* of a struct with //kvcm:go in, not consumed,
//     becomes T's Go value (fromC<T>, whose errors name the parameter's
//     fields); it is not nullable. With len= it is a borrowed array (NULL
//     only for 0 elements) that becomes a []G of the Go values, nil for
//     none, each element's errors naming it as p[i].
//   - buffer=<needed>: a T* with len=capacity; the glue returns ([]G,
//     error), G from go= or the elements' //kvcm:go out struct, and the
//     export writes the count to needed and the elements when they fit,
//     else KVCM_ERR_BUFFER_TOO_SMALL.
//   - reset, on a buffer=: a get-and-reset query. The glue gets one more
//     argument, room int (how many elements the caller's buffer holds, 0
//     for a size query), and returns ([]G, n int, error): the n elements,
//     taken and reset only when they fit in room, otherwise nil and n,
//     resetting nothing; the export writes n to needed and the taken
//     elements, or reports KVCM_ERR_BUFFER_TOO_SMALL. The rule lives in
//     core/abimodel (Manager.GetAndReset*(room)).
//   - take, on a buffer= with one nested buffer (of=, with its own
//     buffer=<count>): a drain into the caller's buffers. The glue gets
//     the room of the buffer and of the nested buffer (ints) and returns
//     ([]G, need int): the elements it took, as many as fit both (each
//     element's array one run after another in the nested buffer), or
//     need > 0, taking nothing, when the first element's array alone does
//     not fit; the export then writes need to the nested buffer's count and
//     reports KVCM_ERR_BUFFER_TOO_SMALL, and otherwise writes the elements,
//     points their array fields at their runs (NULL for none) and writes
//     both counts. A result parameter (nullable: written when not NULL)
//     comes after them. The rule lives in core/abimodel
//     (EventQueue.Drain and DrainCacheEvents for kvcm_manager_drain_events
//     and _drain_block_events).
//   - into=<param>.<Go field>: a scalar that sets a field of the Go value
//     of the convert parameter param (cast to the field's type), instead of
//     reaching the glue: has_lora_id is into=scope.HasLoRA.
//   - of=<buffer>.<C field>, on a T* with len=capacity (and optionally
//     buffer=<needed>): the nested buffer of the array field of the
//     buffer's structs (kvcm_pool_group_desc.pools). The glue returns the
//     buffer's Go elements, whose slices the elements' toC converter
//     writes into the nested buffers, one element's run after another, and
//     points the fields at (NULL for none). The export writes every count
//     (the buffer's needed, each nested buffer's total), then, unless every
//     buffer is NULL with capacity 0 (a size query), reports
//     KVCM_ERR_BUFFER_TOO_SMALL naming all counts when one does not fit,
//     writing nothing else, or writes them all.
//   - column=<Go field>, on a buffer= with go=<Go struct>, and
//     column=<buffer>.<Go field> on other T*s of scalars with the buffer's
//     len=: parallel caller arrays, one per field of the glue's Go
//     elements (kvcm_kv_cache_get_committed_digests: positions from
//     blockhash.DigestAt.Pos, digest_bytes from its Digest). A scalar field
//     takes one C element per Go element, an array field its length (32
//     bytes per digest: room for 32 * capacity), which kvcmgen reads from
//     the Go type. The export writes the count to needed; unless every
//     array is NULL with capacity 0 (a size query) it reports
//     KVCM_ERR_BUFFER_TOO_SMALL when the capacity is short of the count,
//     writing nothing else, or writes every column.
//   - sized: a T* with len= an input count (the length of an input array
//     too: cp_get_allocation_priority's order); the glue returns []G, G from
//     go= or the elements' //kvcm:go out struct, with at most that many
//     elements, which the export writes (more is KVCM_ERR_INTERNAL).
//   - result: a T* out-parameter; the glue returns its value, and the
//     export writes it, cast or through the struct's toC converter, only on
//     success (a nullable one only when it is not NULL).
//
// A glue with outputs returns one value per result, sized or buffer
// parameter, in parameter order (a reset buffer's: its elements and n; a
// take buffer's: its elements and need), then the error:
// kvcm_kv_cache_get_scratch_desc's glue returns (begin, end, slots, error). The export writes the results, then the sized
// outputs, then the buffer.
//
// # Functions without glue: //kvcm:call, //kvcm:gomodel
//
// A function whose glue would only call one Go function names it with
// //kvcm:call, and kvcmgen writes the call in the export instead of a call
// to glue<Name>: a method chain on its first parameter's handle
// (//kvcm:call Core().TokensPerBlock on a kvcm_manager), or a package-level
// variable or function (//kvcm:call
// github.com/kvcm/kvcm/core/abimodel.Devices.Free). The function gets
// what the glue would (the conventions above applied, the handle's object
// as the receiver), each argument cast to its parameter's type, and
// returns one value per output, with or without an error after them (a
// function without outputs may return nothing). A handle type's
// //kvcm:gomodel <import path>.<Type> names the object-model type its Go
// type embeds (abimodel.Manager behind managerObj), against which kvcmgen
// resolves the chain: a method chain that names no method, or a function
// whose arguments or results do not match, is a generator error.
//
// # Python value types: //kvcm:pyvalue
//
// A struct of scalars with //kvcm:pyvalue [Name] [order=a,b,...]
// [prefix=p] [counters] gets a frozen dataclass of the same name (or Name)
// in the Python layer (kvcm._ffi), its fields in C order (or order='s),
// with _from_c to read it from the C struct (BlockStats, PeakBlockStats,
// MigrationStats, SharedStats, CacheEvent, BufferLocation,
// PoolGroupPeakBlockStats): a field appended to the struct appears in
// Python with make generate. py:"name" renames a field, py:"-" leaves it
// out (a key the caller reads from the C struct: the layer group of the
// iteration statistics), pydefault:"v" gives its default; prefix=p starts
// every field's name (KVCacheManagerV2's iter_ counters). counters makes it
// a mutable record of int counters, each defaulting to 0: the iteration
// statistics KVCacheIterationStatsDelta and SsmSnapshotIterationStatsDelta,
// under the hand-written classes of kvcm.stats, which add the counters'
// add/subtract/copy/clear/empty and the hit rates. A public class with
// behaviour derives from the generated one (manager.BufferLocation adds
// page_index and page_address, PoolGroupStats used, PageIndexConverter its
// call and its own field scratch_pages_per_block, after the generated
// ones) and so keeps _from_c.
// An enum with //kvcm:pyenum <Name> [A=B,...] gets a second IntEnum Name
// of the same values, the members A renamed B, which the value types use
// for its fields: TierKind's CacheTier, with TensorRT-LLM's GPU_MEM and
// HOST_MEM (kvcm.CacheTier).
//
// # Vtables implemented in Go: //kvcm:goimpl
//
// A vtable with //kvcm:goimpl <impl> <import path>.<Type> (the default
// codec's: abimodel.DefaultCodec) gets a C table whose slots forward to Go
// exports kvcm__go_<impl>_<slot>, all generated, which call the methods of
// *<Type>, one per slot, named as the slot (or its go:"Name" tag): each
// finds its object by the generated lookup<Impl>(self) (self is the handle
// of a *<Type>), returns the slot's fail value (its fail:"..." tag, a
// number or a C constant; otherwise false, -1 for an int32_t failure code,
// or 0) when self is not a live object or the library is poisoned, and
// else converts the parameters by the conventions of //kvcm:gocaller the
// other way round: const T* with a count where T has //kvcm:go becomes a
// []G of T's Go struct (a NULL array with a count, or a struct the
// converter rejects, fails the slot: configure's pool group descriptors);
// void*, const void* and const T* where T has no //kvcm:go an address, a Go
// uintptr type (encode's index pairs: the method views them where its
// codec wants them); a scalar is cast. An int32_t result is the method's
// error, any other scalar result its only result, cast. kvcmgen checks
// every method's signature against its slot. A panic poisons the library
// and returns the fail value. A slot without a result runs on a poisoned
// library too, and destroy frees self's handle first and calls Destroy
// only when it did, so one of concurrent destroys runs it.
//
// # Configuration value types: //kvcm:cppvalue, //kvcm:pyconfig
//
// A struct with //kvcm:cppvalue <Name> [order=a,b,...] gets an owning C++
// value type kvcm::<Name> (std::string for a const char*, std::vector for
// an array with its count, std::optional for a nullable single pointer, the
// enum class for an enum) and detail::C<Name>, its conversion to the C
// struct for one call, which rejects a NUL byte in a string naming the
// field's path (KVCM_ERR_INVALID_CONFIG; with the argument arg, for a value
// passed to a function such as BufferName, KVCM_ERR_INVALID_ARGUMENT); a
// string with a length (len=) is bytes, NUL bytes allowed (ReuseScope's
// salt), and an array of a struct without a value type is a std::vector of
// its C struct (AggregatedPage's buffers). With out, the value type is a
// result instead: detail::fromC copies the C struct the library wrote into
// it (CacheEvent, BlockEvent, AggregatedPage). See gen/emit_cppvalue.go. One with //kvcm:pyconfig <Name>
// gets a Python dataclass <Name> in kvcm/_values.py with _to_c, which
// writes the fields into the ctypes struct through _convert.set_field
// (errors name the field's path); see gen/emit_pyconfig.go. The public
// classes of kvcm.config derive from the Python ones and add their
// behaviour (type checks, TensorRT-LLM's aliases). Field tags: cpp:"name"
// and py:"name" rename a field in a binding ("-": not in it, the binding
// converts it by hand), cppdefault:"v" and pydefault:"v" give its default,
// path:"name" the name C++ errors give it. //kvcm:cppfield and
// //kvcm:pyfield "name type [default] | doc" add a field the C struct
// lacks (converted by hand), //kvcm:cppdoc and //kvcm:pydoc lines replace
// the struct's doc, //kvcm:cppmethod lines are C++ member functions,
// verbatim. order= lists the binding's fields (their binding names) where
// the binding's order differs from C's (C++ aggregate initialization and
// Python's positional arguments follow it).
//
// # Python classes of a struct split by kind: //kvcm:pyvariant
//
// A struct whose Python form is one class per value of an enum field (the
// tiers: kvcm_cache_tier_config by kind) has a //kvcm:pyvariant <Name>
// <enum field>=<member> fields=a[=default],... line per class: Name (in
// kvcm/_values.py) holds the struct with the enum field fixed to member, a
// read-only property named by the field's py tag (Kind `py:"tier"`: the
// tier property, of the //kvcm:pyenum type CacheTier), and only the fields
// fields= names (their Python names), in that order, each with the default
// given there (none: required; None: None stands for the C zero). A field
// the class has but the struct lacks is declared by
// //kvcm:pyvariantfield <Name> name int|bool [default] into=<field> | doc
// and named in fields= for its place: it goes to the field into= of the
// struct that holds the array of the struct (the tiers' kvcm_manager_config:
// GpuCacheTierConfig.pool_granularity to gpu_pool_granularity,
// DiskCacheTierConfig.persistent to disk_persistent, a bool or-ed in). A
// const char* field tagged pytype:"path" is a filesystem path: a str or an
// os.PathLike, os.fsencode'd (the disk tier's path). Each class gets
// _check_types(path), a TypeError naming the first field of the wrong type
// in field order ("cache_tiers[1].path: expected a str or path, got int"),
// and _to_c(c, parent, path, keep), which writes the member, its fields
// (errors naming their paths; a NUL byte in a path is an InvalidConfigError)
// and its own fields into parent. The public classes of kvcm.config derive
// from them and add their behaviour (assert_valid); a field appended to the
// struct reaches a class when a fields= list names it. See
// gen/emit_pyvariant.go.
//
// C++'s counterpart is //kvcm:cppvariant <Name> <enum field>=<member>
// args=<field>:<param>[=default],... on a //kvcm:cppvalue struct (C++
// names): a struct Name deriving from the value type whose constructor
// fixes the enum field to the member and takes the fields args= names as
// parameters of their types, in that order, every other field keeping its
// default; it is explicit when one argument can call it
// (GpuCacheTierConfig(quotaBytes, maxQuotaBytes = 0),
// HostCacheTierConfig(quotaBytes), DiskCacheTierConfig(quotaBytes,
// directory, persistentTier = false)). See gen/emit_cppvariant.go.
//
// # Vtables and callbacks implemented elsewhere: //kvcm:gocaller, //kvcm:cppimpl
//
// A vtable with //kvcm:gocaller <import path>.<Type> (a Go struct of funcs:
// abimodel.ExternalCP, abimodel.ExternalCodec) gets goCaller<Name>(vt,
// self), which sets the func of every present slot to one that calls it
// from Go; the rules of the object (what a missing slot means, how results
// are checked, destroy once) live in the Go type that takes the funcs
// (abimodel.NewExternalIndex, abimodel.NewExternalCodec), tested in plain
// Go. A versioned one also gets check<Name>(vt, arg), the error that makes
// a caller's vtable unusable, naming arg: abi_version 0, a struct_size that
// does not cover the slots of its first version that must be present (with
// none, the 8 bytes of struct_size and abi_version), or such a slot NULL. A //kvcm:callback with
// //kvcm:gocaller names a Go func type (abimodel.BlockPriorityFunc) and gets
// goCaller<Name>(fn, userData), nil for NULL; a struct field of that
// callback type tagged user:"Field" (the void* passed to it) converts to a
// Go field of the func type in the struct's in converter, so the glue never
// sees the C function pointer. A vtable with //kvcm:cppimpl gets
// detail::<CppName>Trampolines<Of> in the C++ declarations, the
// capture-less functions a C++ adapter puts in the vtable. Both map a
// slot's parameters by convention: pointer and length (const char* p,
// size_t pLen) as a string, const T* with a size_t count as a slice, T*
// with size_t capacity and size_t* needed as a two-call buffer result, T*
// as a result, int32_t as the failure code (an error in Go). The Go callers
// also take: const T* with a count (size_t or an integer typedef) where T
// has //kvcm:go, as a []G of T's Go struct copied into C memory for the
// call, nested arrays and strings with a length included (configure's pool
// group descriptors, get_allocation_priority's request ids); T* (T a
// scalar) that the slot's sized:"p=n" tag names, as a []G result of n
// elements (n the size_t parameter, an input array's count), all ones
// where the slot writes nothing (get_allocation_priority's order);
// void*, const void* and const T* where T has no //kvcm:go, as a uintptr
// address the Go side keeps valid (encode's index pairs: pinned host pairs
// or a device address); and a scalar result other than int32_t (bool,
// size_t, an enum, a typedef) as the func's only result. A slot that
// follows none is tagged go:"-" or cpp:"-" and adapted by hand.
//
// # Changes
//
// ABI version 2 (appended, nothing of version 1 moved):
//
//   - kvcm_manager_config gains reuse_match_backoff, text_only,
//     commit_min_snapshot, the rebalance_* fields, and the system prompt
//     lengths of typical_step and constraints (kvcm_batch_desc is frozen).
//     The default max_util_for_resume is now 0.97 (KVCacheManagerV2's).
//     A non-NULL initial_pool_ratio with num_initial_pool_ratio 0 is
//     rejected (NULL means unset).
//   - Per-layer-group iteration statistics, reuse by level, cached tokens
//     by level, available/unavailable/evictable peaks, and
//     kvcm_manager_drain_block_events, whose kvcm_block_event carries
//     priorities, the level a page left and the new
//     KVCM_EVENT_BLOCK_PRIORITY_UPDATED kind, which kvcm_manager_drain_events
//     skips.
//   - kvcm_manager_config.shared_tier (a kvcm_shared_tier_config: a cold
//     tier shared across nodes on a Redis Cluster) and
//     kvcm_shared_write_policy; kvcm_manager_config.block_key (the opt-in
//     XXH3 block key) and disk_persistent (a disk tier whose blobs the next
//     manager on its directory reuses; a directory in use is
//     KVCM_ERR_INVALID_STATE).
//   - KVCacheManagerV2's reuse rules: a fully cached prompt is reused whole
//     (less reuse_match_backoff); kvcm_kv_cache_options.scope_has_lora_id
//     (LoRA adapter 0 is a scope of its own) and layer_group_priority (a
//     priority callback per block and layer group); kvcm_kv_cache_commit
//     advances the history length; kvcm_manager_probe_reuse_v2,
//     _probe_first_new_block_key, _clear_reusable_blocks,
//     _get_num_open_caches, kvcm_kv_cache_set_stream and
//     _get_committed_tokens; stream arguments take any stream of the
//     device's context (an engine's CUstream, 0 included).
//   - Beam search: kvcm_kv_cache_get_beam_width / _set_beam_width,
//     kvcm_kv_cache_get_beam_base_page_indices,
//     kvcm_kv_cache_commit_beam_search, KVCM_DEFAULT_BEAM_INDEX and
//     KVCM_MAX_BEAM_WIDTH.
//   - SWA scratch reuse and planned drops (issue 13 item 4):
//     kvcm_manager_config.swa_scratch_reuse and swa_scratch_max_rewind_len,
//     kvcm_kv_cache_get_scratch_desc, _has_scratch_slots,
//     _get_swa_scratch_reuse, _set_swa_scratch_reuse,
//     kvcm_manager_get_scratch_pages_per_block, and the kvcm_planned_drop
//     handle of kvcm_kv_cache_plan_committed_block_drop with
//     kvcm_planned_drop_drop and _destroy.
//   - Pool sizing (issue 13 item 6): the rebalance_* fields take effect;
//     kvcm_manager_need_adjustment, kvcm_manager_adjust and
//     kvcm_manager_clamp_max_seq_len_for_mem.
//   - SSM layers: kvcm_ssm_layer_config and kvcm_manager_config.ssm_layers,
//     num_ssm_layers and max_ssm_slots (commit_min_snapshot is required
//     with them and now has an effect), kvcm_kv_cache_get_ssm_block_base_index,
//     kvcm_ssm_snapshot_iteration_stats and
//     kvcm_manager_get_and_reset_ssm_snapshot_iteration_stats;
//     kvcm_reuse_diagnostics and kvcm_kv_cache_get_reuse_diagnostics; a
//     kvcm_request_desc's capacity may be 0 (a request holding only its SSM
//     state).
//   - KVCacheManagerV2's disaggregated transfer layout:
//     kvcm_manager_get_aggregated_pages (kvcm_buffer_id in,
//     kvcm_aggregated_page_desc and kvcm_expanded_buffer out),
//     kvcm_kv_cache_get_aggregated_page_indices,
//     kvcm_manager_get_page_index_converter (kvcm_page_index_converter),
//     _get_page_stride and _get_page_index_upper_bound; and
//     kvcm_manager_config.buffer_tokens_per_block_overrides (a buffer's own
//     tokens per block: kvcm_buffer_config is frozen).
//   - Multimodal digest tokens: kvcm_block_keys (a sequence's block keys,
//     digests included), kvcm_kv_cache_options.input_digest_positions,
//     input_digest_bytes and text_only, kvcm_kv_cache_commit_digests,
//     _get_committed_digests, kvcm_manager_probe_reuse_digests and
//     _probe_first_new_block_key_digests, and
//     kvcm_manager_drain_block_events_digests (stored blocks with their
//     digest tokens).
//   - The shared tier at run time: kvcm_manager_get_shared_level
//     (KVCM_NO_SHARED_LEVEL without one), kvcm_manager_get_shared_stats
//     (kvcm_shared_stats) and kvcm_manager_flush_shared, which waits at
//     most its timeout_ms; KVCM_TIER_SHARED names the shared tier's kind.
//   - The built-in codecs: kvcm_create_builtin_cold_page_codec
//     (kvcm_builtin_codec_options: kvcm_builtin_codec selects the default,
//     gather, FP8 or auto codec; kvcm_element_type is the FP8 codec's hot
//     element type). kvcm_manager_create makes a gather, FP8 or auto codec
//     on the device it opens; the gather and FP8 codecs are CUDA only
//     (KVCM_ERR_CODEC_REJECTED on the emulated device).
//   - Queue-aware eviction (issue 18 item 3):
//     kvcm_manager_set_block_priorities sets the eviction priority of cached
//     blocks along a chain of block keys (a waiting request's, from the CP
//     index), and KVCM_DEFAULT_PRIORITY is the priority that returns them to
//     the common order.
//   - kvcm_manager_probe_reuse_pages (kvcm_reuse_page): per block of a
//     content match, the page of a layer group covering the most of it and
//     its covered tokens (KVCacheManagerV2's partial-coverage pages).
//   - With enable_partial_reuse and no SSM layers, an ACTIVE cache of one
//     beam publishes the trailing partial block of its committed tokens
//     when its commits stop (kvcm_kv_cache_commit with is_end,
//     kvcm_kv_cache_stop_committing), as KVCacheManagerV2 commits it, so
//     other caches reuse it while it stays open; it was published at
//     close (still the rule for a cache of several beams or not ACTIVE).
//   - Fresh runs (issue 18): kvcm_kv_cache_options.fresh_blocks and
//     fresh_from_block, a reuse plan that computes a run of the cached
//     prefix while the blocks after it are onboarded, and
//     kvcm_kv_cache_get_fresh_range; errors name fresh_blocks and
//     fresh_from_block. C++: kvcm::FreshRun{blocks, fromBlock} with
//     KVCacheManager::createKVCache(tokens, run, ...) and
//     createKVCacheForRequest(id, tokens, run, ...), and
//     KVCache::freshRange(); Python: create_kv_cache(...,
//     fresh_blocks=k, fresh_from_block=f), keyword-only, and the cache's
//     fresh_range. kvcm_kv_cache_resume of a cache whose run is owed makes
//     the stream wait for the pages the run's compute uses, not for the
//     tail's (it waited for every page before), and
//     kvcm_kv_cache_wait_fresh_tail enqueues the tail's wait; C++:
//     KVCache::waitFreshTail(stream), Python: the cache's
//     wait_fresh_tail(cuda_stream=None).
//   - With SSM layers, commits stopping (kvcm_kv_cache_commit with is_end,
//     kvcm_kv_cache_stop_committing) on a partial block of a cache whose
//     capacity is its committed length give the cache's own SSM state page
//     to that block at close, as KVCacheManagerV2 moves live pages at a
//     final partial commit; a copy was taken. The copy is still taken when
//     the capacity is past the committed length, or by the
//     kvcm_kv_cache_resize that grows it past.
//   - kvcm_kv_cache_decode_steps (issue 11): a run of one-token decode
//     steps (resize by one token, commit it) in one call, equivalent to the
//     per-step calls.
//
// Behaviour that changed for C users while ABI version 1 was unreleased
// (no function, struct or constant changed):
//
//   - kvcm_manager_destroy_stream fails with KVCM_ERR_INVALID_STATE, naming
//     the cache and changing nothing, while an ACTIVE cache uses the stream.
//     It used to destroy the stream, after which the cache could be neither
//     suspended nor closed and kvcm_manager_destroy leaked its pages. The
//     stream parameter is no longer marked consumed: a refused stream stays
//     alive. C++ Stream::destroy() throws kvcm::Error (kInvalidState) and
//     keeps the stream; Python Stream.close() raises InvalidStateError and
//     leaves it open.
//   - kvcm_manager_destroy always releases everything: a cache whose
//     stream cannot be fenced is closed anyway and the error reported after
//     the release. Closing open caches on destroy is now also the rule of
//     Go's core.Manager.Close, which used to refuse with caches open.
//   - kvcm_manager_drain_events that fails with KVCM_ERR_BUFFER_TOO_SMALL
//     after draining past priority updates keeps the count of events
//     dropped for the next drain; it used to lose it.
//   - kvcm_kv_cache_create racing with kvcm_manager_destroy of its manager
//     returns a handle that is already invalid (as when the destroy comes
//     just after the create returns); it used to fail with
//     KVCM_ERR_INVALID_HANDLE.
//   - KVCM_BUILTIN_CODEC_AUTO on CUDA moves pages below its crossover with
//     the staged codec (the gather kernel into device staging, then DMA)
//     rather than the gather kernel over mapped host memory, and its default
//     crossover is 1 MiB rather than 256 KiB: measured on the H200, staging
//     holds 0.92–0.97 of the two-stream DMA limit with both directions at
//     once where the kernel held 0.55–0.60, and beats DMA up to 1 MiB. The
//     cold bytes are the same.
//   - C++ CPIndex::managerBacked passes its scope's has_lora_id flag, as
//     Python's ManagerBackedCPIndex does: a ReuseScope with loraId 0 scores
//     adapter 0's blocks; it used to score those without an adapter.
//
// The bindings' configuration and event types are generated from this
// description (//kvcm:cppvalue, //kvcm:pyconfig; no function, struct or
// constant changed): the C++ KVCacheManagerConfig, its tiers, layers,
// buffers and batches, CacheEvent and BlockEvent (kvcm_values_generated.hpp),
// and the fields and C conversion of Python's configuration classes
// (kvcm/_values.py, under the hand-written classes of kvcm.config). Their
// names, fields, field order, defaults and errors are what they were, with
// one unification: Python's kvcm.SharedWritePolicy is the generated enum
// (kvcm._ffi.SharedWritePolicy, the same members and values) rather than a
// second copy of it. So are, with the same names, fields, order, defaults
// and errors: C++ ReuseScope, BufferName, AggregatedPage and
// BuiltinColdPageCodecOptions, Python's kvcm.CacheTier (//kvcm:pyenum),
// and the fields and C conversion of Python's BufferLocation,
// PageIndexConverter, PoolGroupStats, PoolGroupPeakBlockStats,
// KVCacheIterationStatsDelta and SsmSnapshotIterationStatsDelta
// (kvcm._ffi, //kvcm:pyvalue); and the fields, type checks and C conversion
// of Python's tier classes GpuCacheTierConfig, HostCacheTierConfig and
// DiskCacheTierConfig (kvcm/_values.py, //kvcm:pyvariant, under the
// hand-written classes of kvcm.config, which keep assert_valid): the same
// fields in the same order with the same defaults (max_quota None,
// pool_granularity -1, persistent False), repr, equality, tier, path
// accepting an os.PathLike, and errors naming the field; and C++'s tier
// constructors GpuCacheTierConfig, HostCacheTierConfig and
// DiskCacheTierConfig (kvcm_values_generated.hpp, //kvcm:cppvariant), with
// the same parameters, defaults and explicitness.
package abi

import (
	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/abimodel"
	"github.com/kvcm/kvcm/gen/spec"
)

// ABIVersion is the version of the ABI described here: the version of the
// newest struct layouts, vtable slots and functions this header declares.
// Version 1 is the first released ABI; a later version may only append
// fields to versioned structs and vtables, and add functions, types and
// constants.
//
//kvcm:since 1
const ABIVersion uint32 = 2

// VersionMajor is the library's major version.
//
//kvcm:since 1
const VersionMajor uint32 = 0

// VersionMinor is the library's minor version.
//
//kvcm:since 1
const VersionMinor uint32 = 1

// VersionPatch is the library's patch version.
//
//kvcm:since 1
const VersionPatch uint32 = 0

// VersionString is the library's version as "major.minor.patch".
//
//kvcm:since 1
const VersionString = "0.1.0"

// BadPageIndex marks a block without a page in a layer group (released out of
// a sliding window, or beyond the capacity) in base page index arrays.
//
//kvcm:since 1
const BadPageIndex int32 = core.BadPageIndex

// DefaultBeamIndex is the beam the single-beam calls read, beam 0, which
// also holds the committed tokens' KV.
//
//kvcm:since 2
const DefaultBeamIndex int32 = core.DefaultBeamIndex

// MaxBeamWidth is the largest beam width a cache may have.
//
//kvcm:since 2
const MaxBeamWidth int32 = core.MaxBeamWidth

// MinPriority is the lowest eviction priority a priority callback may return.
//
//kvcm:since 1
const MinPriority int32 = core.MinPriority

// MaxPriority is the highest eviction priority a priority callback may return.
//
//kvcm:since 1
const MaxPriority int32 = core.MaxPriority

// DefaultPriority is the eviction priority of a block whose pages were
// allocated without a priority callback.
//
//kvcm:since 2
const DefaultPriority int32 = core.DefaultPriority

// DefaultEventQueueCapacity is the capacity of a manager's event queue when
// kvcm_manager_config.event_queue_capacity is 0.
//
//kvcm:since 1
const DefaultEventQueueCapacity uint32 = abimodel.DefaultEventQueueCapacity

// keep the spec import used even if every file above changes.
var _ spec.Size
