package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A node finds each of its children whether it holds it inline or in its
// map, also after removals and re-additions, and lists them in key order.
func TestNodeFindsEveryChild(t *testing.T) {
	parent := &node{}
	kids := []*node{{key: 30, tokens: seq(0, tpb)}, {key: 10, tokens: seq(4, tpb)}, {key: 20, tokens: seq(8, tpb)}}
	partial := &node{key: 5, tokens: seq(0, 2)}
	for _, k := range kids {
		parent.addChild(k, tpb)
	}
	parent.addChild(partial, tpb)
	for _, k := range kids {
		assert.Same(t, k, parent.child(k.key))
	}
	assert.Nil(t, parent.child(partial.key), "partial blocks are no keyed children")
	assert.Equal(t, []*node{kids[1], kids[2], kids[0], partial}, sortedChildren(parent))

	parent.removeChild(kids[0]) // the inline one
	assert.Nil(t, parent.child(30))
	assert.Same(t, kids[1], parent.child(10))
	assert.True(t, parent.hasChildren())
	again := &node{key: 40, tokens: seq(12, tpb)}
	parent.addChild(again, tpb)
	assert.Same(t, again, parent.child(40))
	assert.Equal(t, []*node{kids[1], kids[2], again, partial}, sortedChildren(parent))

	for _, c := range []*node{kids[1], kids[2], again, partial} {
		parent.removeChild(c)
	}
	assert.False(t, parent.hasChildren())
	assert.Empty(t, sortedChildren(parent))
}
