package abimodel

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The first panic poisons the library and its message is the one every
// later refusal reports, however many panics race to poison it.
func TestTheFirstPanicPoisonsAndKeepsItsMessage(t *testing.T) {
	var p Poison
	assert.False(t, p.Poisoned())
	assert.Empty(t, p.Reason())
	assert.True(t, p.Set("kvcm_a: panic: first"))
	assert.False(t, p.Set("kvcm_b: panic: second"))
	assert.True(t, p.Poisoned())
	assert.Equal(t, "kvcm_a: panic: first", p.Reason())

	var q Poison
	var wg sync.WaitGroup
	wins := make(chan string, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := fmt.Sprintf("panic %d", i)
			if q.Set(msg) {
				wins <- msg
			}
		}()
	}
	wg.Wait()
	close(wins)
	var won []string
	for w := range wins {
		won = append(won, w)
	}
	if assert.Len(t, won, 1) {
		assert.Equal(t, won[0], q.Reason())
	}
}
