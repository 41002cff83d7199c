package abitest

import (
	"testing"
)

// FuzzABI decodes its input into a bounded sequence of C ABI calls on one
// manager (any codec object kind, a GPU tier and maybe a host tier): caches
// created with shared prefixes, resumed on streams the manager made,
// resized, committed, suspended and closed in any order, streams destroyed,
// levels resized, reuse probed. Errors are fine; a panic, a poisoned library,
// a manager that cannot be destroyed at the end, or a live handle count that
// does not return to its start are failures.
func FuzzABI(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 4, 2, 0, 0, 0, 3, 0, 0, 4, 8, 8, 0, 5, 8, 0, 0, 6, 0, 0, 0, 0, 1, 0, 3, 0, 0, 8, 0, 0})
	f.Add([]byte{2, 2, 8, 0, 0, 0, 1, 0, 0, 3, 0, 0, 4, 16, 16, 5, 16, 1, 6, 0, 0, 0, 0, 0, 3, 1, 0, 9, 0, 0, 7, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 3, 0, 0, 10, 0, 0, 4, 12, 12, 11, 1, 0, 12, 0, 0, 8, 0, 0, 10, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := data
		next := func() int {
			if len(in) == 0 {
				return 0
			}
			b := int(in[0])
			in = in[1:]
			return b
		}
		before := LiveHandles()
		defer func() {
			if got := LiveHandles(); got != before {
				t.Fatalf("live handles: %d at the start, %d at the end", before, got)
			}
			if IsPoisoned() {
				t.Fatal("the library is poisoned")
			}
		}()
		kind := CodecKind(next() % 7)
		cfg := smallConfig(int64(2+next()%8), int64(next()%9))
		var codec *Codec
		if kind != NoCodec {
			var err error
			if codec, err = NewCodec(kind); err != nil {
				return
			}
		}
		m, err := CreateManager(cfg, codec)
		if err != nil {
			return // the codec object was consumed all the same
		}
		type cache struct {
			h      uint64
			tokens []int32
			stream uint64 // while ACTIVE
			hist   int64
			commit int
		}
		var caches []*cache
		var streams []uint64
		inUse := func(s uint64) bool {
			for _, c := range caches {
				if c.stream == s {
					return true
				}
			}
			return false
		}
		pick := func(b int) *cache {
			if len(caches) == 0 {
				return nil
			}
			return caches[b%len(caches)]
		}
		for ops := 0; ops < 60 && len(in) > 0; ops++ {
			op, a, b := next(), next(), next()
			switch op % 13 {
			case 0, 1: // create, sharing one of three prefixes
				toks := append(seq(int32(100*(a%3)), int32(tpb*(1+a%3))), seq(int32(1000+b), int32(b%9))...)
				h, err := CreateCache(m, 0, "", toks)
				if err == nil {
					caches = append(caches, &cache{h: h, tokens: toks})
				}
			case 2:
				if s, err := CreateStream(m); err == nil {
					streams = append(streams, s)
				}
			case 3:
				if c := pick(b); c != nil && len(streams) > 0 {
					s := streams[a%len(streams)]
					if Resume(c.h, s) == nil {
						c.stream = s
					}
				}
			case 4:
				if c := pick(b); c != nil {
					capa := c.hist + int64(a%(3*tpb))
					if Resize(c.h, capa, min(capa, int64(len(c.tokens)))) == nil {
						c.hist = min(capa, int64(len(c.tokens)))
					}
				}
			case 5:
				if c := pick(b); c != nil {
					n := min(a%(2*tpb+1), int(c.hist)-c.commit)
					if n >= 0 && Commit(c.h, c.tokens[c.commit:c.commit+n], a%5 == 0) == nil {
						c.commit += n
					}
				}
			case 6:
				if c := pick(b); c != nil && Suspend(c.h) == nil {
					c.stream = 0
				}
			case 7:
				if c := pick(b); c != nil && CloseCache(c.h) == nil {
					for i, x := range caches {
						if x == c {
							caches = append(caches[:i], caches[i+1:]...)
							break
						}
					}
				}
			case 8:
				if len(streams) > 0 {
					i := a % len(streams)
					s := streams[i]
					err := DestroyStream(m, s)
					switch {
					case inUse(s) && err == nil:
						t.Fatalf("destroying stream %#x, which an ACTIVE cache uses, succeeded", s)
					case err == nil:
						streams = append(streams[:i], streams[i+1:]...)
					}
				}
			case 9:
				ProbeReuse(m, 0, "", seq(int32(100*(a%3)), int32(1+b%16)))
			case 10:
				ResizeLevel(m, int32(a%len(cfg.Tiers)), int64(1+b%12)*pageBytes)
			case 11:
				if c := pick(b); c != nil {
					BasePageIndices(c.h, 0, 1+a%8)
					GetCacheInfo(c.h)
				}
			case 12:
				StorageStats(m, int32(a%3))
				DrainEvents(m, 1+a%4, 1+b%16)
			}
			if IsPoisoned() {
				t.Fatalf("the library is poisoned after op %d", op%13)
			}
		}
		for _, c := range caches {
			if err := CloseCache(c.h); err != nil {
				t.Errorf("close cache %#x: %v", c.h, err)
			}
		}
		for _, s := range streams {
			DestroyStream(m, s) // may report the stream's asynchronous failures
		}
		if err := DestroyManager(m); err != nil {
			t.Fatalf("destroy the manager: %v", err)
		}
	})
}
