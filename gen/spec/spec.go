// Package spec holds the marker types an ABI description is written with.
//
// kvcmgen reads a description package (gen/abi for kvcm itself) with
// golang.org/x/tools/go/packages. Its declarations use ordinary Go types for
// fixed-width scalars (int32 → int32_t, uint64 → uint64_t, float64 → double,
// bool → bool, uint8 → uint8_t, uintptr → uintptr_t) and the types below for
// what Go cannot say directly: pointer direction and constness, size_t,
// C strings and opaque pointers.
//
// Directives (comment lines of the form //kvcm:name args, which go/doc keeps
// out of the documentation text) carry the rest:
//
//	on a type:      //kvcm:enum trim=<GoPrefix> cprefix=<C_PREFIX_> cpp=<Name>
//	                //kvcm:struct, //kvcm:versioned, //kvcm:align <n>
//	                //kvcm:vtable, //kvcm:callback, //kvcm:handle, //kvcm:typedef
//	                //kvcm:opaque, //kvcm:status, //kvcm:since <v>, //kvcm:cname <name>
//	                //kvcm:cpp <name>, //kvcm:cppalias <name> (an extra C++ alias)
//	on a constant:  //kvcm:cname <NAME>, //kvcm:since <v>
//	on a function:  //kvcm:since <v>, //kvcm:thread <any|manager|stream|handle>
//	                //kvcm:impl <go|c|api>
//	                //kvcm:param <name> <flag,flag,...> <doc text>
//	                //kvcm:returns <doc text>
//
// Functions are declared as func types (type ManagerCreate func(...) *Status)
// so that the description compiles and is type-checked. Struct fields take
// the tags own:"borrowed|owned|consumed", len:"<count field>", nullable:"true",
// since:"<v>" and c:"<c name>".
//
// Versions: a field's since defaults to its struct's. Only a
// //kvcm:versioned struct (one that starts with struct_size) may gain fields
// in a later version, and only at its end: fields are in non-decreasing
// since order. A struct that is not versioned is frozen when it appears.
// ABIVersion, when declared, must be at least the newest since used.
//
// A CStr parameter of a vtable slot or callback that is followed by a Size
// parameter named after it plus "Len" (requestID, requestIDLen) is
// length-delimited, like a CStr field with a len tag or a function
// parameter with a len= flag: bytes, not a NUL-terminated string.
package spec

// In is a borrowed, read-only input pointer: const T* (an array when a
// length is given, by a len tag or a //kvcm:param len= flag).
type In[T any] struct{ _ *T }

// Out is a pointer the callee writes through: T*. As a function parameter it
// is an output (an out-parameter, or a caller-provided buffer with a len).
type Out[T any] struct{ _ *T }

// InOut is a pointer the callee reads and writes: T*.
type InOut[T any] struct{ _ *T }

// Size is size_t.
type Size uintptr

// CStr is const char*: a NUL-terminated UTF-8 string, or bytes with a length
// when a len tag names one.
type CStr struct{ _ *byte }

// VoidPtr is void*: an opaque pointer the library never dereferences.
type VoidPtr struct{ _ *byte }

// ConstVoidPtr is const void*.
type ConstVoidPtr struct{ _ *byte }
