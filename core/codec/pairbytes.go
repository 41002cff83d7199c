package codec

import (
	"encoding/binary"
	"unsafe"
)

// hostLittleEndian is whether PageIndexPair's memory already is the wire
// layout (int32 dst, int32 src, little-endian), so PairBytes can be a view.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// PairBytes is pairs in the layout device-index codecs read (the design's
// PageIndexPair array: int32 dst, int32 src, little-endian, 8 bytes each),
// for an index upload. On a little-endian host it is a view of pairs' own
// memory, no copy, valid while pairs is; elsewhere it encodes into scratch,
// grown as needed, and returns it. Index uploads consume their bytes during
// the call (see staging.IndexRing.Upload), so either may be reused at once.
func PairBytes(pairs []PageIndexPair, scratch *[]byte) []byte {
	if len(pairs) == 0 {
		return nil
	}
	if hostLittleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(pairs))), len(pairs)*PageIndexPairBytes)
	}
	buf := (*scratch)[:0]
	for _, p := range pairs {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(p.Dst))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(p.Src))
	}
	*scratch = buf
	return buf
}
