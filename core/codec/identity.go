package codec

// Identifier is an optional interface of a ColdPageCodec: Identity names the
// cold format the codec writes, with its version and every parameter that
// changes the encoded bytes (for example "kvcm.concat/1"). Two codecs with
// the same identity decode each other's blobs, so blobs they wrote may
// outlive the process (persistent disk tier) or be shared between managers.
// A codec without an identity writes blobs only the manager that wrote them
// reads.
type Identifier interface {
	Identity() string
}

// ConcatIdentity is the identity of the default codec's cold format, which
// every lossless built-in codec writes byte for byte.
const ConcatIdentity = "kvcm.concat/1"

// IdentityOf returns c's identity, looking through Guard, and whether c has
// one (an empty identity counts as none).
func IdentityOf(c ColdPageCodec) (string, bool) {
	if g, ok := c.(*Guarded); ok {
		c = g.inner
	}
	id, ok := c.(Identifier)
	if !ok {
		return "", false
	}
	s := id.Identity()
	return s, s != ""
}

func (c *concatCodec) Identity() string { return ConcatIdentity }
