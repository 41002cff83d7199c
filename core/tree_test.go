package core

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
)

// A node finds each of its children whether it holds it inline or in the
// store's map, also after removals and re-additions, and lists them in key
// order, partial blocks last in the order they came.
func TestNodeFindsEveryChild(t *testing.T) {
	m := newFixture(t, smallConfig(8)).m
	m.mu.Lock()
	defer m.mu.Unlock()
	parent := m.newNode(nil, 1, nil, nil)
	kids := []*node{m.newNode(parent, 30, seq(0, tpb), nil), m.newNode(parent, 10, seq(4, tpb), nil), m.newNode(parent, 20, seq(8, tpb), nil)}
	partial := m.newNode(parent, 5, seq(0, 2), nil)
	partial2 := m.newNode(parent, 6, seq(0, 3), nil)
	for _, k := range kids {
		m.addChild(parent, k)
	}
	m.addChild(parent, partial)
	m.addChild(parent, partial2)
	for _, k := range kids {
		assert.Same(t, k, m.child(parent, k.key))
	}
	assert.Nil(t, m.child(parent, partial.key), "partial blocks are no keyed children")
	assert.Equal(t, []*node{kids[1], kids[2], kids[0], partial, partial2}, m.sortedChildren(parent))

	m.removeChild(parent, kids[0]) // the inline one
	m.removeChild(parent, partial)
	assert.Nil(t, m.child(parent, 30))
	assert.False(t, m.isChild(parent, kids[0]))
	assert.Same(t, kids[1], m.child(parent, 10))
	assert.True(t, parent.hasChildren())
	again := m.newNode(parent, 40, seq(12, tpb), nil)
	m.addChild(parent, again)
	assert.Same(t, again, m.child(parent, 40))
	assert.Equal(t, []*node{kids[1], kids[2], again, partial2}, m.sortedChildren(parent))

	for _, c := range []*node{kids[1], kids[2], again, partial2} {
		assert.True(t, m.isChild(parent, c))
		m.removeChild(parent, c)
	}
	assert.False(t, parent.hasChildren())
	assert.Empty(t, m.sortedChildren(parent))
	assert.Empty(t, m.nodes.kids, "no map entry outlives its child")
}

// childHolding finds the child holding a block's tokens, by comparing them
// while the node has one full-block child and by its key with more, and
// finds none for other tokens (also when a key names a child holding other
// tokens: a collision).
func TestChildHoldingFindsTheBlocksTokens(t *testing.T) {
	m := newFixture(t, smallConfig(8)).m
	m.mu.Lock()
	defer m.mu.Unlock()
	h := blockhash.NewHasher()
	parent := m.newNode(nil, 1, nil, nil)
	a, b := seq(0, tpb), seq(4, tpb)
	ka := m.newNode(parent, h.Next(parent.key, a), a, nil)
	m.addChild(parent, ka)
	assert.Same(t, ka, m.childHolding(parent, a, nil), "the one full child, by its tokens")
	assert.Nil(t, m.childHolding(parent, b, nil))
	assert.Nil(t, m.childHolding(parent, a[:tpb-1], nil), "a shorter block is no full child")
	kb := m.newNode(parent, h.Next(parent.key, b), b, nil)
	m.addChild(parent, kb)
	assert.Same(t, ka, m.childHolding(parent, a, nil), "by key with two children")
	assert.Same(t, kb, m.childHolding(parent, b, nil))
	assert.Nil(t, m.childHolding(parent, seq(8, tpb), nil))

	other := m.newNode(nil, 2, nil, nil)
	c := seq(12, tpb)
	collide := m.newNode(other, h.Next(other.key, c), a, nil) // c's key, a's tokens
	m.addChild(other, collide)
	sibling := m.newNode(other, h.Next(other.key, b), b, nil)
	m.addChild(other, sibling)
	assert.Nil(t, m.childHolding(other, c, nil), "the child c's key names holds other tokens")
}

// A freed node's ID is reused, and the reused node starts empty: no tokens
// or digest tokens from its last use, default priorities and no pages.
func TestFreedNodesAreReusedEmpty(t *testing.T) {
	m := newFixture(t, smallConfig(8)).m
	m.mu.Lock()
	defer m.mu.Unlock()
	root := m.newNode(nil, 1, nil, nil)
	dg := []blockhash.DigestAt{{Pos: 1, Digest: blockhash.Digest{7}}}
	n := m.newNode(root, 2, seq(0, tpb), dg)
	require.Equal(t, dg, m.digestsOf(n))
	m.prioOf(n)[0] = MaxPriority
	id := n.id
	m.freeNode(n)
	assert.Empty(t, m.nodes.digests, "a freed node's digests go with it")
	again := m.newNode(root, 3, seq(0, 2), nil)
	assert.Equal(t, id, again.id)
	assert.Equal(t, seq(0, 2), m.tokensOf(again))
	assert.Nil(t, m.digestsOf(again), "a reused ID starts without the digests of its last node")
	assert.Equal(t, DefaultPriority, m.prioOf(again)[0])
	assert.False(t, m.hasPages(again))
	assert.Equal(t, 1, again.depth)
}

// A freed page is reused only after the operation's safe point, and then
// starts zero.
func TestFreedPagesAreReusedAfterTheSafePoint(t *testing.T) {
	f := newFixture(t, smallConfig(8))
	c := f.open(blockhash.Scope{}, seq(0, 6)) // a private partial block
	p := c.blocks[1].pages[0]
	require.Nil(t, p.node)
	require.NoError(t, c.Close())
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	assert.Empty(t, f.m.pages.dead, "recycled at close's safe point")
	q := f.m.pages.alloc()
	assert.Same(t, p, q, "the freed page is the next one handed out")
	assert.Equal(t, page{}, *q)
	f.m.pages.release(q)
	assert.NotSame(t, q, f.m.pages.alloc(), "not before the next safe point")
}

// Two token sequences are the same exactly when slices.Equal says so: the
// byte comparison sees length, order and sign.
func TestSameTokensIsElementEquality(t *testing.T) {
	cases := [][2][]config.Token{
		{nil, nil}, {nil, {}}, {{1, 2, 3}, {1, 2, 3}}, {{1, 2, 3}, {1, 2}}, {{1, 2, 3}, {3, 2, 1}},
		{{-1}, {1<<31 - 1}}, {{0, 0, 0, 1}, {0, 0, 0, 0}}, {seq(0, 32), seq(0, 32)}, {seq(0, 32), seq(1, 32)},
	}
	for _, c := range cases {
		assert.Equal(t, slices.Equal(c[0], c[1]), sameTokens(c[0], c[1]), "%v %v", c[0], c[1])
	}
}
