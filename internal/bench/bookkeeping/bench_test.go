package bookkeeping

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/blockhash"
	"github.com/kvcm/kvcm/core/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Main runs the whole benchmark on a small trace and prints both tables.
func TestMainPrintsBothTables(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Main([]string{"-prompts", "1k,2k", "-requests", "4", "-rounds", "1", "-steps", "40", "-held", "1k,4k", "-window", "256"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	for _, form := range []string{"per-step calls", "DecodeSteps, 1 token a call", "DecodeSteps, one call a block"} {
		assert.Regexp(t, `\| 1k \| false \| sha256 \| `+form+` \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 256 \| 0\.0 \| [01]\.[0-9]{2} \| [0-9.]+ \|`, out.String())
		assert.Regexp(t, `\| 1k \| false \| xxh3 \| `+form+` \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 256 \| 0\.0 \| [01]\.[0-9]{2} \| [0-9.]+ \|`, out.String())
		assert.Regexp(t, `\| 2k \| true \| sha256 \| `+form+` \| `, out.String())
		assert.Regexp(t, `\| full attention \| `+form+` \| 4k \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|`, out.String())
		assert.Contains(t, out.String(), "| half the layers in a 256-token window | "+form+" | 1k |")
	}
	assert.Contains(t, out.String(), "| 1k | false | sha256 | per-step calls | ", "the reference first")
}

// Bad flags are usage errors naming the flag.
func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-prompts", "x"}, {"-held", "0"}, {"-window", "8"}, {"-requests", "1"}, {"-keys", "md5"}, {"-forms", "both"}} {
		var errOut bytes.Buffer
		assert.Equal(t, 2, Main(args, io.Discard, &errOut), args)
		assert.NotEmpty(t, errOut.String(), args)
	}
}

// BenchmarkDecodeStep is one decode step at each held size, for profiling.
func BenchmarkDecodeStep(b *testing.B) {
	for _, held := range []int{1 << 10, 128 << 10} {
		b.Run(tokens(held), func(b *testing.B) {
			r, err := newRig(int64(held+b.N)/tokensPerBlock+8, 0, blockhash.SHA256)
			require.NoError(b, err)
			defer r.close()
			prompt := trace(rand.New(rand.NewPCG(1, 1)), 1, held)[0]
			c, err := r.m.CreateKVCache(core.CacheOptions{InputTokens: prompt})
			require.NoError(b, err)
			defer c.Close()
			require.NoError(b, r.prefill(c, prompt))
			b.ReportAllocs()
			b.ResetTimer()
			require.NoError(b, decode(c, held, b.N, vocab, PerStep))
		})
	}
}

// BenchmarkRequest is one request of the trace as Run times it, for
// profiling: the requests of one trace of DefaultConfig's size run on one
// manager sized as runTrace sizes it, a fresh manager (untimed) per trace.
func BenchmarkRequest(b *testing.B) {
	def := DefaultConfig()
	for _, size := range def.Prompts {
		for _, pressure := range []bool{false, true} {
			for _, key := range def.BlockKeys {
				b.Run(fmt.Sprintf("%s/eviction=%v/%v", tokens(size), pressure, key), func(b *testing.B) {
					prompts := trace(rand.New(rand.NewPCG(1, 1)), def.Requests, size)
					perRequest := int64(size+def.DecodeSteps)/tokensPerBlock + 2
					slots := perRequest*int64(len(prompts)) + 8
					if pressure {
						slots = 2*perRequest + 8
					}
					var r *rig
					defer func() {
						if r != nil {
							r.close()
						}
					}()
					b.ReportAllocs()
					for i := range b.N {
						if i%len(prompts) == 0 {
							b.StopTimer()
							if r != nil {
								require.NoError(b, r.close())
							}
							var err error
							r, err = newRig(slots, 0, key)
							require.NoError(b, err)
							b.StartTimer()
						}
						_, err := r.request(prompts[i%len(prompts)], def.DecodeSteps, config.Token(vocab+i%len(prompts)*def.DecodeSteps), PerStep)
						require.NoError(b, err)
					}
				})
			}
		}
	}
}
