package codec_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/layout"
	"github.com/kvcm/kvcm/internal/testkit/codectest"
)

func TestOwnedIsTakenExactlyOnce(t *testing.T) {
	f := codectest.NewFaulty(codec.NewDefault())
	o := codec.Own(f)
	require.NotNil(t, o)
	assert.False(t, o.Consumed())

	c, err := o.Take()
	require.NoError(t, err)
	assert.Same(t, f, c)
	assert.True(t, o.Consumed())

	c, err = o.Take()
	assert.ErrorIs(t, err, codec.ErrConsumed)
	assert.Nil(t, c, "a consumed handle yields no codec")
	assert.ErrorIs(t, o.Discard(), codec.ErrConsumed)
	assert.Zero(t, f.Closes(), "taking does not destroy: the taker owns it now")
}

func TestOwnNilMeansNoCodecSupplied(t *testing.T) {
	o := codec.Own(nil)
	assert.Nil(t, o)
	c, err := o.Take()
	assert.NoError(t, err)
	assert.Nil(t, c)
	assert.False(t, o.Consumed())
	assert.NoError(t, o.Discard())
}

func TestOwnedConcurrentTakesHaveOneWinner(t *testing.T) {
	o := codec.Own(codec.NewDefault())
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, losses := 0, 0
	for range 32 {
		wg.Go(func() {
			c, err := o.Take()
			mu.Lock()
			defer mu.Unlock()
			if err == nil && c != nil {
				wins++
			} else if errors.Is(err, codec.ErrConsumed) {
				losses++
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 1, wins)
	assert.Equal(t, 31, losses)
}

func TestOwnedDiscardDestroysTheCodec(t *testing.T) {
	f := codectest.NewFaulty(codec.NewDefault())
	o := codec.Own(f)
	require.NoError(t, o.Discard())
	assert.Equal(t, 1, f.Closes())
	assert.True(t, o.Consumed())
}

// newManager stands in for the manager constructor: it consumes the codec
// first, then owns it through configuration and destroys it on any failure.
func newManager(o *codec.Owned, descs []layout.PoolGroupDesc, lifecycles []layout.LayerGroupID) (_ codec.ColdPageCodec, err error) {
	c, err := o.Take()
	if err != nil {
		return nil, err
	}
	if c == nil {
		c = codec.NewDefault()
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, codec.Destroy(c))
		}
	}()
	if !c.Configure(descs) {
		return nil, errors.New("codec rejected the configuration")
	}
	if _, err := codec.QueryAll(c, lifecycles); err != nil {
		return nil, err
	}
	return c, nil
}

func TestOwnershipIsConsumedOnSuccessAndOnFailure(t *testing.T) {
	descs := configuredDefaultDescs()
	lcs := []layout.LayerGroupID{0, 1, 2, 3}

	t.Run("success", func(t *testing.T) {
		f := codectest.NewFaulty(codec.NewDefault())
		o := codec.Own(f)
		c, err := newManager(o, descs, lcs)
		require.NoError(t, err)
		assert.True(t, o.Consumed())
		assert.Zero(t, f.Closes(), "the manager keeps it")
		require.NoError(t, codec.Destroy(c))
		assert.Equal(t, 1, f.Closes())
	})
	t.Run("configure rejected", func(t *testing.T) {
		f := codectest.NewFaulty(codec.NewDefault())
		f.RejectConfigure(true)
		o := codec.Own(f)
		_, err := newManager(o, descs, lcs)
		require.Error(t, err)
		assert.True(t, o.Consumed(), "consumed although construction failed")
		assert.Equal(t, 1, f.Closes(), "destroyed by the failed constructor, exactly once")
		_, err = newManager(o, descs, lcs)
		assert.ErrorIs(t, err, codec.ErrConsumed, "the relinquished handle cannot be used again")
	})
	t.Run("query failure after configure", func(t *testing.T) {
		f := codectest.NewFaulty(codec.NewDefault())
		f.SetBatchingID(3, -1)
		o := codec.Own(f)
		_, err := newManager(o, descs, lcs)
		require.ErrorIs(t, err, codec.ErrQuery)
		assert.Equal(t, 1, f.ConfigureCalls())
		assert.Equal(t, 1, f.Closes())
	})
	t.Run("default reference codec", func(t *testing.T) {
		o := codec.CreateDefaultColdPageCodec()
		c, err := newManager(o, descs, lcs)
		require.NoError(t, err)
		assert.True(t, o.Consumed())
		_, err = o.Take()
		assert.ErrorIs(t, err, codec.ErrConsumed)
		require.NoError(t, codec.Destroy(c))
		assert.Zero(t, c.QueryColdPageBytes(0), "a destroyed default codec is unusable")
	})
	t.Run("none supplied", func(t *testing.T) {
		c, err := newManager(nil, descs, lcs)
		require.NoError(t, err)
		assert.EqualValues(t, 64, c.QueryColdPageBytes(0))
	})
}
