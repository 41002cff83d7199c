// Package codec is the cold-page codec contract of kvcm: the Go form of the
// design's IKvCacheColdPageCodec, the default lossless concatenating codec, and
// the helpers every codec and the manager share.
//
// A hot page spans every pool of its lifecycle's hot pool group; a cold page is
// one fixed-size opaque blob. A ColdPageCodec transforms between the two:
// Encode turns hot pages into cold blobs, Decode turns cold blobs back into hot
// pages. The C header mirrors ColdPageCodec one to one, so the interface keeps
// the design's shape (bool and size results, explicit index location) rather
// than idiomatic Go errors.
//
// Ownership. A codec handed to the manager is consumed by the constructor
// whether construction succeeds or fails. In Go this is explicit: wrap the
// codec with Own, pass the *Owned, and the manager calls Take, after which the
// *Owned is unusable (ErrConsumed). A codec that holds resources implements
// io.Closer; its owner calls Close (see Destroy) when it is done with it, also
// when construction failed.
package codec

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/kvcm/kvcm/core/device"
	"github.com/kvcm/kvcm/core/layout"
)

// PageIndexLocation says where the PageIndexPair array of an Encode or Decode
// call lives. It mirrors the design's enum class PageIndexLocation : int.
type PageIndexLocation int32

const (
	// BadLocation reports a failure or an unknown lifecycle. It is never a
	// valid location of an index array.
	BadLocation PageIndexLocation = -1
	// Host: the pairs are in host memory and valid only during the call; the
	// codec consumes them before it returns.
	Host PageIndexLocation = 0
	// Device: the pairs are in device memory and valid until the work the
	// call enqueued on its stream has completed.
	Device PageIndexLocation = 1
)

func (l PageIndexLocation) String() string {
	switch l {
	case BadLocation:
		return "bad-location"
	case Host:
		return "host"
	case Device:
		return "device"
	}
	return fmt.Sprintf("PageIndexLocation(%d)", int32(l))
}

// Valid reports whether l is Host or Device.
func (l PageIndexLocation) Valid() bool { return l == Host || l == Device }

// PageIndexPair is the destination and source index of one logical page copy.
// It mirrors the design's struct alignas(8) PageIndexPair { int32_t dst;
// int32_t src; }: 8 bytes, 8-byte aligned, Dst at offset 0 and Src at offset 4,
// so a device work item fetches both with one aligned 64-bit load and a host
// codec iterates the same array. Use keyed literals: PageIndexPair{Dst: d, Src: s}.
type PageIndexPair struct {
	_   [0]uint64 // aligns the struct to 8 bytes, as alignas(8); occupies no space
	Dst int32
	Src int32
}

// PageIndexPairBytes is the size of one PageIndexPair, sizeof(PageIndexPair).
const PageIndexPairBytes = 8

// PageIndices is the index array of one Encode or Decode call: either a host
// slice or a device pointer with a count, in the location the codec selected
// with QueryPageIndexLocation. The zero value is an empty host array.
type PageIndices struct {
	loc  PageIndexLocation
	host []PageIndexPair
	dev  device.Ptr
	n    int
}

// HostIndices returns host-located indices. The slice is borrowed for the
// codec call only.
func HostIndices(pairs []PageIndexPair) PageIndices {
	return PageIndices{loc: Host, host: pairs, n: len(pairs)}
}

// DeviceIndices returns n device-located pairs starting at p. The pairs are
// borrowed until the work the codec enqueues on the call's stream completes.
func DeviceIndices(p device.Ptr, n int) PageIndices {
	return PageIndices{loc: Device, dev: p, n: n}
}

// Location is Host or Device.
func (ix PageIndices) Location() PageIndexLocation { return ix.loc }

// Len is the number of pairs (the design's numBasePages).
func (ix PageIndices) Len() int { return ix.n }

// Host returns the host pairs, or nil when the indices are on the device.
func (ix PageIndices) Host() []PageIndexPair {
	if ix.loc != Host {
		return nil
	}
	return ix.host
}

// DevicePtr returns the device address of the first pair, or 0 when the
// indices are on the host.
func (ix PageIndices) DevicePtr() device.Ptr {
	if ix.loc != Device {
		return 0
	}
	return ix.dev
}

// ColdPageCodec transforms pages between the hot representation (one slot in
// every pool of a hot pool group) and the cold representation (one fixed-size
// opaque blob). It mirrors the design's IKvCacheColdPageCodec one to one.
//
// Contract (every rule of the design):
//
//   - Configure is called exactly once, before any other method, with every
//     hot pool group. The descriptors form a contiguous array ordered by
//     PoolGroupIndex and descriptor i has Index i. Returning false rejects the
//     complete configuration. A second call must return false.
//   - QueryColdPageBytes returns a fixed cold-page payload size per
//     lifecycle; 0 means failure (or an unknown lifecycle). Variable-sized
//     output is not supported.
//   - GetBatchingLayerGroupID returns the smallest lifecycle of lg's
//     codec-equivalence class. Equal IDs promise identical Encode/Decode
//     behaviour: algorithm, parameters, cold-page size and encoded
//     representation. Membership in the same hot pool group is a necessary
//     additional precondition (the manager checks it). The default is the
//     identity (see HotLayout.GetBatchingLayerGroupID), which disables
//     cross-lifecycle batching. A negative ID means failure or an unknown
//     lifecycle.
//   - QueryPageIndexLocation selects where the index array of both Encode and
//     Decode lives. Lifecycles with the same batching ID must return the same
//     location. Compressing codecs normally select Device; a codec that
//     consumes the indices synchronously (to build batched copy descriptors,
//     page-wise copies or kernel parameters) may select Host. BadLocation
//     means failure or an unknown lifecycle and is never a valid location.
//   - The manager may concatenate the index pairs of any subset of the
//     lifecycles sharing a batching ID and make one call with that
//     representative ID. It does not promise that every member is present,
//     and it may split a batch into several calls (device indices are
//     chunked at 64 KiB).
//   - Encode and Decode enqueue their work on stream and do not synchronize
//     it.
//   - The bool result of Encode and Decode reports synchronous validation and
//     submission success, not completion of the asynchronous work; that work
//     reports failure through the stream (device package doc). On false the
//     manager synchronizes the stream and releases the destination slots, so
//     a codec returning false must not have enqueued writes to the
//     destination. After a false Encode the source pages stay where they
//     were, retryable; after a false Decode the manager drops the source
//     pages (the cold copy it could not bring back) as lost, so a codec that
//     keeps rejecting a page cannot make its prefix unservable. The manager
//     treats a panic in any method as that method's failure (see Guarded).
//   - Host indices (PageIndices.Host) are valid only until the call returns;
//     asynchronous work must not retain or dereference them.
//   - Device indices (PageIndices.DevicePtr) are valid until all codec work
//     enqueued on stream completes; the codec uses them only on that stream
//     and does not retain them beyond that work.
//   - Each PageIndexPair is the destination and source index of one logical
//     page copy.
//   - The data base pointers (the hot pools' bases from Configure, dstBase and
//     srcBase) are GPU-accessible and may be used by work enqueued on stream,
//     but must not be retained beyond that work.
//
// The lifecycle is passed to the size query and to both transforms because
// lifecycles sharing a hot pool group may use different cold formats and
// sizes. Disk addresses are never passed to a codec: every data base pointer
// is GPU-accessible. The hot pool bases are device memory (the host reaches
// them only by copies); the cold base (dstBase of Encode, srcBase of Decode)
// is always HostMapped memory, a host tier's pool or the pinned staging ring
// of a disk tier, which host code may touch in stream order (in a HostFunc).
// stream is always the manager's migration stream, which outlives the codec:
// scratch kept across calls is reused safely in stream order and freed when
// the codec is destroyed, after all its work has completed.
//
// Addressing. For lifecycle lg, the hot pool group is the PoolGroupDesc whose
// LifeCycles contains lg; hot slot s is the bytes Pool.Base + s*Pool.SlotBytes
// of every pool of that group. Cold page c is the QueryColdPageBytes(lg) bytes
// at base + c*QueryColdPageBytes(lg). Encode: pair.Src is a hot slot and the
// cold page is written at dstBase + pair.Dst*QueryColdPageBytes(lg). Decode is
// the mirror: pair.Src is a cold page at srcBase + pair.Src*QueryColdPageBytes(lg)
// and pair.Dst is the hot slot written.
//
// Concurrency. The manager serializes calls on one codec (one lock per
// manager instance), from any goroutine.
type ColdPageCodec interface {
	// Configure supplies every hot pool group's layout and base addresses,
	// once. It returns false to reject the configuration.
	Configure(gpuDescs []layout.PoolGroupDesc) bool
	// QueryColdPageBytes is the fixed cold-page size of lg; 0 is failure.
	QueryColdPageBytes(lg layout.LayerGroupID) int64
	// GetBatchingLayerGroupID is the smallest lifecycle of lg's equivalence
	// class; negative is failure or an unknown lifecycle.
	GetBatchingLayerGroupID(lg layout.LayerGroupID) layout.LayerGroupID
	// QueryPageIndexLocation is where Encode's and Decode's indices live for
	// lg; BadLocation is failure or an unknown lifecycle.
	QueryPageIndexLocation(lg layout.LayerGroupID) PageIndexLocation
	// Encode enqueues on stream the encoding of hot slots idx[i].Src into
	// cold pages at dstBase + idx[i].Dst*QueryColdPageBytes(lg). It reports
	// synchronous validation and submission success.
	Encode(lg layout.LayerGroupID, dstBase device.Ptr, idx PageIndices, stream device.Stream) bool
	// Decode enqueues on stream the decoding of cold pages at srcBase +
	// idx[i].Src*QueryColdPageBytes(lg) into hot slots idx[i].Dst. It reports
	// synchronous validation and submission success.
	Decode(lg layout.LayerGroupID, srcBase device.Ptr, idx PageIndices, stream device.Stream) bool
}

// Destroy ends the life of a codec its caller owns: it calls Close when c
// implements io.Closer and does nothing otherwise. A nil c is a no-op. The
// owner must have waited for all work the codec enqueued before destroying it.
func Destroy(c ColdPageCodec) error {
	if cl, ok := c.(io.Closer); ok && cl != nil {
		return cl.Close()
	}
	return nil
}

// NativeSizer is implemented by codecs whose cold-page sizes come from an
// unsigned native type (a C codec's size_t): QueryAll asks
// NativeColdPageBytes instead of QueryColdPageBytes, so that a size beyond
// the int64 range (SIZE_MAX, say) is reported as the codec returned it rather
// than narrowed.
type NativeSizer interface {
	NativeColdPageBytes(lg layout.LayerGroupID) uint64
}

// Info is what a codec reports for one lifecycle.
type Info struct {
	LifeCycle     layout.LayerGroupID
	ColdPageBytes int64
	BatchingID    layout.LayerGroupID
	Location      PageIndexLocation
}

// ErrQuery is wrapped by every error QueryAll returns.
var ErrQuery = errors.New("codec query failed")

// QueryError is one failure value a codec returned from a query.
type QueryError struct {
	LifeCycle layout.LayerGroupID
	Method    string // "QueryColdPageBytes", "GetBatchingLayerGroupID" or "QueryPageIndexLocation"
	Value     int64  // the value returned (0 when Native does not fit)
	// Native is the size a NativeSizer returned, when it does not fit an
	// int64.
	Native uint64
}

func (e *QueryError) Error() string {
	var what string
	switch e.Method {
	case "QueryColdPageBytes":
		switch {
		case e.Native == math.MaxUint64:
			what = fmt.Sprintf("returned %d bytes (SIZE_MAX, more than an int64 holds)", e.Native)
		case e.Native != 0:
			what = fmt.Sprintf("returned %d bytes (more than an int64 holds)", e.Native)
		case e.Value < 0:
			what = fmt.Sprintf("returned %d bytes (negative size)", e.Value)
		default:
			what = fmt.Sprintf("returned %d bytes (0 is failure)", e.Value)
		}
	case "GetBatchingLayerGroupID":
		what = fmt.Sprintf("returned %d (negative is failure or unknown lifecycle)", e.Value)
	case "QueryPageIndexLocation":
		what = fmt.Sprintf("returned %v (not host or device)", PageIndexLocation(e.Value))
	default:
		what = fmt.Sprintf("returned %d", e.Value)
	}
	return fmt.Sprintf("codec: lifecycle %d: %s %s", e.LifeCycle, e.Method, what)
}

// Unwrap makes errors.Is(err, ErrQuery) hold.
func (e *QueryError) Unwrap() error { return ErrQuery }

// QueryAll asks c for the cold-page size, batching ID and index location of
// every lifecycle, in order. It returns one Info per lifecycle and, if any
// query returned a failure value (0, negative or (for a NativeSizer) beyond
// int64 bytes, a negative batching ID,
// a location other than Host or Device), an error naming every failing
// lifecycle and method: one *QueryError per failure (reachable with errors.As;
// several are joined in one message separated by "; ") and each wraps
// ErrQuery. It checks no relation between
// lifecycles: validating equivalence classes is the manager's job.
func QueryAll(c ColdPageCodec, lifecycles []layout.LayerGroupID) ([]Info, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil codec", ErrQuery)
	}
	infos := make([]Info, len(lifecycles))
	var errs []error
	for i, lc := range lifecycles {
		bytes, native := coldPageBytes(c, lc)
		in := Info{
			LifeCycle:     lc,
			ColdPageBytes: bytes,
			BatchingID:    c.GetBatchingLayerGroupID(lc),
			Location:      c.QueryPageIndexLocation(lc),
		}
		infos[i] = in
		if in.ColdPageBytes <= 0 {
			errs = append(errs, &QueryError{LifeCycle: lc, Method: "QueryColdPageBytes", Value: in.ColdPageBytes, Native: native})
		}
		if in.BatchingID < 0 {
			errs = append(errs, &QueryError{LifeCycle: lc, Method: "GetBatchingLayerGroupID", Value: int64(in.BatchingID)})
		}
		if !in.Location.Valid() {
			errs = append(errs, &QueryError{LifeCycle: lc, Method: "QueryPageIndexLocation", Value: int64(in.Location)})
		}
	}
	if len(errs) == 0 {
		return infos, nil
	}
	return infos, joined(errs)
}

// coldPageBytes queries lc's cold-page size; for a NativeSizer whose size
// does not fit an int64 it returns 0 and the native value.
func coldPageBytes(c ColdPageCodec, lc layout.LayerGroupID) (int64, uint64) {
	var n uint64
	switch cc := c.(type) {
	case *Guarded:
		var ok bool
		if n, ok = cc.nativeColdPageBytes(lc); !ok {
			return c.QueryColdPageBytes(lc), 0
		}
	case NativeSizer:
		n = cc.NativeColdPageBytes(lc)
	default:
		return c.QueryColdPageBytes(lc), 0
	}
	if n > math.MaxInt64 {
		return 0, n
	}
	return int64(n), 0
}

// joinedErrors is errors.Join with a one-line message ("; " separated), which
// reads better in logs and C status messages than Join's newlines.
type joinedErrors []error

func (j joinedErrors) Error() string {
	parts := make([]string, len(j))
	for i, e := range j {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

func (j joinedErrors) Unwrap() []error { return j }

func joined(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return joinedErrors(errs)
}
