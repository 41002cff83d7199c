package abitest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestManagerDestroyRacingCacheCloseReleasesCPIndexOnce: a cache closed
// by kvcm_kv_cache_close while kvcm_manager_destroy runs must be closed once.
// glueManagerDestroy collects the caches, then for each ignores the result of
// deleteHandle and closes it anyway; a concurrent kvcm_kv_cache_close that won
// deleteHandle closes it too. A tracked cache then releases its CP index
// twice, so the delegating index's destroy slot runs while the index's
// handle is still live (use after destroy of the caller's object).
func TestManagerDestroyRacingCacheCloseReleasesCPIndexOnce(t *testing.T) {
	const rounds, caches = 20, 64
	for r := 0; r < rounds; r++ {
		m, err := CreateManager(smallConfig(256, 0), nil)
		require.NoError(t, err)
		cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
		require.NoError(t, err)
		require.NoError(t, AttachCP(m, cp))
		var cs []uint64
		for i := 0; i < caches; i++ {
			c, err := CreateCacheForRequest(m, fmt.Sprintf("req-%d", i), nil, 0)
			require.NoError(t, err)
			cs = append(cs, c)
		}
		before := GetTestIndexStats()
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_ = DestroyManager(m)
		}()
		for i := len(cs) - 1; i >= 0; i-- {
			wg.Add(1)
			go func(c uint64) {
				defer wg.Done()
				<-start
				_ = CloseCache(c) // INVALID_HANDLE when the manager got there first
			}(cs[i])
		}
		close(start)
		wg.Wait()
		destroyed := GetTestIndexStats().Sub(before).Destroyed
		require.Zero(t, destroyed, "round %d: the CP index's destroy slot ran while its handle %#x is live", r, cp)
		require.NoError(t, CPDestroy(cp))
		require.Equal(t, int64(1), GetTestIndexStats().Sub(before).Destroyed)
	}
}

// TestAttachCPRacingCPDestroy: kvcm_manager_attach_cp looks the index
// up, then takes a reference under the manager's lock; a kvcm_cp_destroy in
// between drops the last reference and runs the destroy slot, and the attach
// then succeeds with a destroyed index (refs back to 1 on a closed object).
// Caches created later notify the destroyed C object.
func TestAttachCPRacingCPDestroy(t *testing.T) {
	m, err := CreateManager(smallConfig(64, 0), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, DestroyManager(m)) }()
	// Keep the manager's lock busy so that attach waits on it after its lookup.
	stop := make(chan struct{})
	var busy sync.WaitGroup
	for i := 0; i < 2; i++ {
		busy.Add(1)
		go func() {
			defer busy.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p, err := Alloc(m, MemoryHostMapped, 8<<20); err == nil {
					_ = Free(m, p)
				}
			}
		}()
	}
	defer func() { close(stop); busy.Wait() }()
	for r := 0; r < 2000; r++ {
		cp, err := CPCreateDelegating(TestIndex{Slots: SlotsAll})
		require.NoError(t, err)
		before := GetTestIndexStats()
		var attachErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); attachErr = AttachCP(m, cp) }()
		go func() {
			defer wg.Done()
			for i := 0; i < r%50; i++ {
				runtime.Gosched()
			}
			_ = CPDestroy(cp)
		}()
		wg.Wait()
		if attachErr == nil && GetTestIndexStats().Sub(before).Destroyed != 0 {
			c, err := CreateCacheForRequest(m, "after-destroy", seq(0, 8), 0)
			require.NoError(t, err)
			require.NoError(t, CloseCache(c))
			d := GetTestIndexStats().Sub(before)
			t.Fatalf("round %d: attach succeeded with an index whose destroy slot already ran; later slot calls on the destroyed object: alloc %d, freed %d", r, d.AllocCalls, d.FreedCalls)
		}
		require.NoError(t, DetachCP(m))
	}
}

// The abitest helpers pass exact capacities to kvcm_manager_get_pool_group_descs,
// and a _test.go file cannot use cgo, so this test calls the export's Go body
// (the function cgo's C trampoline calls) directly. Its C types are
// integers and pointers of the same sizes.
//
//go:linkname reviewGetPoolGroupDescs github.com/kvcm/kvcm/capi.kvcm_manager_get_pool_group_descs
func reviewGetPoolGroupDescs(manager uint64, level int32, descs unsafe.Pointer, descsCap uint64, lcs unsafe.Pointer, lcsCap uint64,
	pools unsafe.Pointer, poolsCap uint64, numDescs, numLCs, numPools *uint64) unsafe.Pointer

//go:linkname reviewDiscardStatus github.com/kvcm/kvcm/capi.discardStatus
func reviewDiscardStatus(s unsafe.Pointer)

func reviewStatus(s unsafe.Pointer) (int32, string) {
	if s == nil {
		return OK, ""
	}
	defer reviewDiscardStatus(s)
	code := *(*int32)(s)
	var msg []byte
	for p := unsafe.Add(s, 4); *(*byte)(p) != 0; p = unsafe.Add(p, 1) {
		msg = append(msg, *(*byte)(p))
	}
	return code, string(msg)
}

// TestPoolGroupDescsHugeCapacityIsAnArgumentError: a capacity too large
// for cSlice (here descs_cap = 2^40 with a valid buffer) passes the
// BUFFER_TOO_SMALL check, then glueManagerGetPoolGroupDescs drops cSlice's
// error and fillPoolGroupDescs indexes the nil slice: a panic, reported as
// KVCM_ERR_INTERNAL, that poisons the whole library. A bad size must be
// KVCM_ERR_INVALID_ARGUMENT naming the argument. Runs in a child process
// because the defect poisons the library.
func TestPoolGroupDescsHugeCapacityIsAnArgumentError(t *testing.T) {
	if os.Getenv("KVCM_ABITEST_CHILD") == "review-descs" {
		m, err := CreateManager(smallConfig(8, 0), nil)
		require.NoError(t, err)
		var nd, nl, np uint64
		code, msg := reviewStatus(reviewGetPoolGroupDescs(m, 0, nil, 0, nil, 0, nil, 0, &nd, &nl, &np))
		require.Equal(t, OK, code, msg)
		descs := make([]byte, 48*(nd+1))
		lcs := make([]int32, nl+1)
		pools := make([]byte, 16*(np+1))
		code, msg = reviewStatus(reviewGetPoolGroupDescs(m, 0, unsafe.Pointer(&descs[0]), 1<<40, unsafe.Pointer(&lcs[0]), nl,
			unsafe.Pointer(&pools[0]), np, &nd, &nl, &np))
		fmt.Printf("REVIEW-RESULT code=%s poisoned=%v msg=%q\n", CodeName(code), IsPoisoned(), msg)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPoolGroupDescsHugeCapacityIsAnArgumentError$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "KVCM_ABITEST_CHILD=review-descs")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "REVIEW-RESULT", "child:\n%s", out)
	require.Contains(t, string(out), "code=KVCM_ERR_INVALID_ARGUMENT poisoned=false", "child:\n%s", out)
}
