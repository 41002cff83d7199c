package disk

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/device/emu"
)

// Run moves every page through the disk tier and measures positive
// bandwidths for both the tier and the raw file.
func TestRunMeasuresBothDirections(t *testing.T) {
	dev := emu.New(emu.Options{})
	defer dev.Close()
	r, err := Run(dev, t.TempDir(), 64<<10, 4<<20, 1)
	require.NoError(t, err)
	require.Positive(t, r.ToDisk)
	require.Positive(t, r.FromDisk)
	require.Positive(t, r.RawSeqWrite*r.RawRndWrite*r.RawSeqRead*r.RawRndRead)
	require.Positive(t, r.WriteRatio*r.ReadRatio)
}
