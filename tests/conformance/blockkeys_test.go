package conformance

import (
	"bufio"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/blockhash"
)

// TestBlockKeys: every line of blockkeys.keys, through blockhash.ChainDigests.
func TestBlockKeys(t *testing.T) {
	f, err := os.Open("blockkeys.keys")
	require.NoError(t, err)
	defer f.Close()
	digests := map[string]blockhash.Digest{}
	sc := bufio.NewScanner(f)
	lines := 0
	for no := 1; sc.Scan(); no++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fs := strings.Fields(line)
		switch {
		case len(fs) == 0:
		case fs[0] == "kvcm-blockkeys":
			require.Equal(t, []string{"kvcm-blockkeys", "1"}, fs)
		case fs[0] == "digest":
			b, err := hex.DecodeString(fs[2])
			require.NoError(t, err)
			require.Len(t, b, blockhash.DigestSize, "line %d", no)
			digests[fs[1]] = blockhash.Digest(b)
		case fs[0] == "keys":
			lines++
			tpb, err := strconv.Atoi(fs[1])
			require.NoError(t, err)
			var scope blockhash.Scope
			if fs[2] != "-" {
				id, err := strconv.ParseInt(fs[2], 10, 64)
				require.NoError(t, err)
				scope = blockhash.LoRA(id)
			}
			if fs[3] != "-" {
				scope.Salt = fs[3]
			}
			rest := strings.Join(fs[5:], " ")
			toksPart, keysPart, ok := strings.Cut(rest, "=")
			require.True(t, ok, "line %d", no)
			var toks []int32
			var ds []blockhash.DigestAt
			for i, tk := range strings.Fields(strings.TrimPrefix(strings.TrimSpace(toksPart), ":")) {
				if name, isDigest := strings.CutPrefix(tk, "@"); isDigest {
					d, ok := digests[name]
					require.True(t, ok, "line %d: digest %s", no, name)
					ds = append(ds, blockhash.DigestAt{Pos: i, Digest: d})
					toks = append(toks, 0)
					continue
				}
				v, err := strconv.ParseInt(tk, 10, 32)
				require.NoError(t, err)
				toks = append(toks, int32(v))
			}
			var want []blockhash.Key
			for _, k := range strings.Fields(keysPart) {
				v, err := strconv.ParseUint(k, 16, 64)
				require.NoError(t, err)
				want = append(want, blockhash.Key(v))
			}
			got, err := blockhash.ChainDigests(blockhash.SHA256, scope, tpb, toks, ds, fs[4] == "partial")
			require.NoError(t, err)
			assert.Equal(t, want, got, "line %d", no)
		default:
			t.Fatalf("line %d: unknown line %q", no, fs[0])
		}
	}
	require.NoError(t, sc.Err())
	assert.Positive(t, lines)
}
