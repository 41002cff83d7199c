package core_test

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core"
	"github.com/kvcm/kvcm/core/codec"
	"github.com/kvcm/kvcm/core/config"
	"github.com/kvcm/kvcm/core/device/emu"
	"github.com/kvcm/kvcm/internal/testkit/disktest"
	"github.com/kvcm/kvcm/internal/testkit/fakeengine"
)

// The rules of a persistent disk tier: a manager started on a directory that
// another manager of the same layout fingerprint left — closed or killed —
// reuses the committed blocks there, every reused byte intact; blobs of
// another fingerprint are never reused; a second live manager on the
// directory is refused. A tier that is not persistent leaves nothing usable
// behind and reclaims what a killed manager left.

func persistConfig(dir string, persistent bool) config.Config {
	layer := func(id int32) config.AttentionLayerConfig {
		return config.AttentionLayerConfig{LayerID: id, Buffers: []config.BufferConfig{
			{Role: config.RoleKey, Size: 512}, {Role: config.RoleValue, Size: 512},
		}}
	}
	disk := config.Disk(512*2048, dir)
	disk.Persistent = persistent
	return config.Config{
		TokensPerBlock: 8,
		CacheTiers:     []config.CacheTierConfig{config.GPU(32 * 2048), config.Host(32 * 2048), disk},
		Layers:         []config.AttentionLayerConfig{layer(0), layer(1)},
	}
}

// persistRig is one manager with its fake engine on a persistent directory.
type persistRig struct {
	m   *core.Manager
	eng *fakeengine.Engine
	dev *emu.Device
}

func openRig(t testing.TB, cfg config.Config, opts ...core.Option) (*persistRig, error) {
	dev := emu.New(emu.Options{Seed: 3})
	m, err := core.NewManager(cfg, append([]core.Option{core.WithDevice(dev)}, opts...)...)
	if err != nil {
		dev.Close()
		return nil, err
	}
	eng, err := fakeengine.New(m, cfg, fakeengine.Options{Seed: 11})
	if err != nil {
		m.Close()
		dev.Close()
		return nil, err
	}
	return &persistRig{m: m, eng: eng, dev: dev}, nil
}

func (r *persistRig) close() error {
	return errors.Join(r.eng.Close(), r.m.Close(), r.dev.Close())
}

// prompt is request i of family f: families share a 12-block prefix.
func prompt(f, i int) []config.Token {
	out := make([]config.Token, 0, 128)
	for t := range 96 {
		out = append(out, config.Token(f*1000+t))
	}
	for t := range 32 {
		out = append(out, config.Token(1_000_000+f*1000+i*40+t))
	}
	return out
}

// serve runs one request on a tier without faults; a request that meets a
// lost page is run again, and must then succeed. It returns the reused
// tokens.
func (r *persistRig) serve(t testing.TB, p []config.Token) int {
	s, err := r.dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	res, err := r.eng.Serve(s, fakeengine.Request{Prompt: p, OutputLen: 4})
	if errors.Is(err, core.ErrDataLost) || errors.Is(err, core.ErrIO) {
		res, err = r.eng.Serve(s, fakeengine.Request{Prompt: p, OutputLen: 4})
	}
	require.NoError(t, err)
	require.Zero(t, res.Verified.Mismatches, "reused bytes: %v", res.Verified.First)
	require.Zero(t, res.Final.Mismatches)
	return res.Reused
}

// serveFaulty runs one request on a tier that keeps failing: a request
// that meets a disk error or a lost page may fail; it reports whether it
// succeeded. Wrong bytes fail the test either way.
func (r *persistRig) serveFaulty(t testing.TB, p []config.Token) bool {
	s, err := r.dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	res, err := r.eng.Serve(s, fakeengine.Request{Prompt: p, OutputLen: 4})
	require.Zero(t, res.Verified.Mismatches, "reused bytes: %v", res.Verified.First)
	require.Zero(t, res.Final.Mismatches)
	if errors.Is(err, core.ErrDataLost) || errors.Is(err, core.ErrIO) {
		return false
	}
	require.NoError(t, err)
	return true
}

// fill serves enough requests to push blocks down to the disk tier.
func (r *persistRig) fill(t testing.TB, families, perFamily int) {
	for i := range perFamily {
		for f := range families {
			r.serve(t, prompt(f, i))
		}
	}
}

// A cleanly closed persistent tier is reused by the next manager: its
// prefixes are found, and every reused byte verifies.
func TestPersistentTierIsReusedAfterClose(t *testing.T) {
	dir := t.TempDir()
	cfg := persistConfig(dir, true)
	r, err := openRig(t, cfg)
	require.NoError(t, err)
	r.fill(t, 12, 2)
	require.NoError(t, r.close())

	r, err = openRig(t, cfg)
	require.NoError(t, err)
	defer r.close()
	require.NoError(t, r.m.CheckInvariants(), "the rebuilt tree is consistent")
	reused := 0
	for f := range 12 {
		reused += r.serve(t, prompt(f, 7))
	}
	t.Logf("reused %d tokens, stats %+v", reused, r.m.Stats())
	assert.Positive(t, reused, "prefixes are found on the disk the last manager left")
}

// A second live manager on a persistent tier's directory is refused with
// ErrDiskInUse; once the first closes, it starts.
func TestSecondManagerOnPersistentDirIsRefused(t *testing.T) {
	cfg := persistConfig(t.TempDir(), true)
	r, err := openRig(t, cfg)
	require.NoError(t, err)
	_, err = openRig(t, cfg)
	require.ErrorIs(t, err, core.ErrDiskInUse)
	assert.Contains(t, err.Error(), "locked")
	require.NoError(t, r.close())
	r, err = openRig(t, cfg)
	require.NoError(t, err)
	require.NoError(t, r.close())
}

// Blobs of another layout fingerprint (here other buffer sizes) are never
// reused: the new manager starts empty and works.
func TestPersistentTierIgnoresOtherFingerprints(t *testing.T) {
	dir := t.TempDir()
	r, err := openRig(t, persistConfig(dir, true))
	require.NoError(t, err)
	r.fill(t, 12, 2)
	require.NoError(t, r.close())

	other := persistConfig(dir, true)
	other.Layers[1].Buffers[1].Size = 256
	r, err = openRig(t, other)
	require.NoError(t, err)
	defer r.close()
	for f := range 12 {
		assert.Zero(t, r.serve(t, prompt(f, 7)), "family %d", f)
	}
}

// A persistent tier needs a codec with an identity, or blobs of another
// format could be read as its own.
func TestPersistentTierNeedsACodecIdentity(t *testing.T) {
	cfg := persistConfig(t.TempDir(), true)
	_, err := core.NewManager(cfg, core.WithDevice(emu.New(emu.Options{})),
		core.WithColdPageCodec(codec.Own(anonymousCodec{codec.NewDefault()})))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "persistent")
}

// anonymousCodec is the default codec without its identity.
type anonymousCodec struct{ codec.ColdPageCodec }

// childEnv makes the test binary a child that serves requests on a disk
// tier until it is killed.
const childEnv = "KVCM_DISK_CHILD"

// TestDiskChild is the child's body; it skips unless childEnv names a
// directory. It prints "ready" after its first requests, then keeps
// evicting to disk.
func TestDiskChild(t *testing.T) {
	dir := os.Getenv(childEnv)
	if dir == "" {
		t.Skip("runs only as the child of a crash test")
	}
	persistent, _ := strconv.ParseBool(os.Getenv(childEnv + "_PERSISTENT"))
	r, err := openRig(t, persistConfig(dir, persistent))
	require.NoError(t, err)
	r.fill(t, 12, 1)
	fmt.Println("ready")
	for i := 1; ; i++ {
		for f := range 12 {
			r.serve(t, prompt(f, i%5))
		}
	}
}

// startChild runs TestDiskChild on dir and waits until it is ready.
func startChild(t *testing.T, dir string, persistent bool) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestDiskChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, childEnv+"_PERSISTENT="+strconv.FormatBool(persistent))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if sc.Text() == "ready" {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	t.Fatalf("child ended before it was ready: %v", sc.Err())
	return nil
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	err := cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child was killed, not finished")
}

// Crash consistency: a manager killed (SIGKILL) at random points of heavy
// eviction to a persistent tier leaves a directory the next manager reuses
// with every reused byte intact — blobs half written at the kill are misses,
// never data — and the directory survives several kills in a row.
func TestKilledPersistentTierIsReusedIntact(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	reused := 0
	for round := range 3 {
		cmd := startChild(t, dir, true)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random point of the child's eviction
		kill9(t, cmd)

		r, err := openRig(t, persistConfig(dir, true))
		require.NoError(t, err, "round %d: the killed manager's lock died with it", round)
		require.NoError(t, r.m.CheckInvariants(), "round %d", round)
		before := r.m.Stats().ReusedBlocks
		for f := range 12 {
			r.serveFaulty(t, prompt(f, 9)) // a torn blob is a miss and may fail its request
		}
		reused += int(r.m.Stats().ReusedBlocks - before)
		assert.Zero(t, r.eng.Mismatches(), "round %d", round)
		require.NoError(t, r.close())
	}
	t.Logf("reused %d blocks", reused)
	assert.Positive(t, reused, "the killed managers' blocks are reused")
}

// A tier that is not persistent, left by a killed manager, is reclaimed by
// the next manager on the directory: the stale file goes, so a restart does
// not run out of space, and nothing of it is reused.
func TestKilledTierIsReclaimedAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	kill9(t, startChild(t, dir, false))
	stale, err := filepath.Glob(filepath.Join(dir, "kvcm-group*-*.blob"))
	require.NoError(t, err)
	require.NotEmpty(t, stale, "the killed manager left its file")

	r, err := openRig(t, persistConfig(dir, false))
	require.NoError(t, err)
	for _, name := range stale {
		assert.NoFileExists(t, name, "reclaimed at start")
	}
	assert.Zero(t, r.serve(t, prompt(0, 0)))
	require.NoError(t, r.close())
	left, err := filepath.Glob(filepath.Join(dir, "kvcm-group*.blob"))
	require.NoError(t, err)
	assert.Empty(t, left, "a clean close removes the tier's files")
}

// Random ENOSPC on writes, and a file whose permissions are revoked under
// the running manager (EACCES on reads and writes), lose only the pages they
// touched: requests go on, recompute, and never see wrong bytes.
func TestDiskFullAndRevokedPermissionsLoseOnlyTheirPages(t *testing.T) {
	for _, ft := range []disktest.Fault{disktest.NoSpace, disktest.Denied} {
		t.Run(ft.String(), func(t *testing.T) {
			files := disktest.New(disktest.Options{Seed: 4, Rate: 0.3, Faults: []disktest.Fault{ft}})
			r, err := openRig(t, persistConfig(t.TempDir(), true), core.WithDiskFiles(files.Open))
			require.NoError(t, err)
			defer r.close()
			served := 0
			for i := range 4 {
				for f := range 12 {
					if r.serveFaulty(t, prompt(f, i)) {
						served++
					}
				}
			}
			t.Logf("%v injected %d, %d of 48 requests served, stats %+v", ft, files.Injected(ft), served, r.m.Stats())
			assert.Positive(t, files.Injected(ft))
			assert.Positive(t, served, "requests go on")
			assert.Zero(t, r.eng.Mismatches())
		})
	}
}

// A disk that fills after construction (another process takes the space)
// fails the writes that evict to it with ENOSPC: the evicted pages are lost,
// requests go on and recompute, no byte is wrong; once space is back, the
// tier stores and serves again.
func TestDiskThatFillsAfterConstruction(t *testing.T) {
	files := disktest.New(disktest.Options{})
	r, err := openRig(t, persistConfig(t.TempDir(), false), core.WithDiskFiles(files.Open))
	require.NoError(t, err)
	defer r.close()
	r.fill(t, 12, 1)
	files.FillAfter(64 << 10)
	for i := 1; i < 4; i++ {
		for f := range 12 {
			r.serveFaulty(t, prompt(f, i))
		}
	}
	assert.Positive(t, files.Injected(disktest.NoSpace), "writes met a full disk")
	assert.Positive(t, r.m.Stats().LostPages)

	files.Free()
	lost := r.m.Stats().LostPages
	for i := 4; i < 7; i++ {
		for f := range 12 {
			r.serveFaulty(t, prompt(f, i))
		}
	}
	reused := 0
	for f := range 12 {
		reused += r.serve(t, prompt(f, 6))
	}
	assert.Positive(t, reused, "with space back the tier serves again")
	assert.Equal(t, lost, r.m.Stats().LostPages, "nothing more is lost")
	assert.Zero(t, r.eng.Mismatches())
}

// Silent damage of a persistent tier's files (overwrites, flipped bits,
// truncation) while managers come and go is a miss, never wrong bytes.
func TestSilentDiskDamageIsNeverReused(t *testing.T) {
	dir := t.TempDir()
	damage := []disktest.Fault{disktest.Overwrite, disktest.FlipBit, disktest.Truncate}
	files := disktest.New(disktest.Options{Seed: 8, Rate: 0.05, Faults: damage})
	for round := range 3 {
		r, err := openRig(t, persistConfig(dir, true), core.WithDiskFiles(files.Open))
		require.NoError(t, err)
		for i := range 2 {
			for f := range 12 {
				r.serveFaulty(t, prompt(f, i))
			}
		}
		assert.Zero(t, r.eng.Mismatches(), "round %d", round)
		require.NoError(t, r.close())
	}
	t.Logf("silent reads %d", files.SilentReads())
	assert.Positive(t, files.SilentReads(), "damaged bytes were read, and caught")
}

// Blobs torn as by a kill in the middle of their write (their second half
// zeros, headers intact) are detected by their payload checksum when read:
// misses, never reused bytes.
func TestTornBlobsAreMissesAfterRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := persistConfig(dir, true)
	r, err := openRig(t, cfg)
	require.NoError(t, err)
	r.fill(t, 12, 2)
	require.NoError(t, r.close())

	f, err := os.OpenFile(filepath.Join(dir, "kvcm-group0.blob"), os.O_RDWR, 0)
	require.NoError(t, err)
	st, err := f.Stat()
	require.NoError(t, err)
	for off := int64(0); off < st.Size(); off += 3 * 2048 {
		_, err := f.WriteAt(make([]byte, 512), off+1024) // past each header, inside a payload
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())

	r, err = openRig(t, cfg)
	require.NoError(t, err)
	defer r.close()
	for f := range 12 {
		r.serveFaulty(t, prompt(f, 7))
	}
	t.Logf("lost pages %d, %+v", r.m.Stats().LostPages, r.m.Stats())
	assert.Positive(t, r.m.Stats().LostPages, "torn blobs were read and dropped")
	assert.Zero(t, r.eng.Mismatches())
}
