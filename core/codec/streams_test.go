package codec

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A codec runs on several streams at once only when it says so: the
// default codec does, a codec without the method does not, and Guard is
// looked through.
func TestIsMultiStreamOnlyWhenDeclared(t *testing.T) {
	assert.True(t, IsMultiStream(NewDefault()))
	assert.True(t, IsMultiStream(Guard(NewDefault())))
	plain := struct{ ColdPageCodec }{NewDefault()} // the method is not promoted through an interface field
	assert.False(t, IsMultiStream(plain))
	assert.False(t, IsMultiStream(Guard(plain)))
}
