package abitest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigConversionNamesTheField: a NULL the generated converters meet
// is an invalid argument naming the field, with its index.
func TestConfigConversionNamesTheField(t *testing.T) {
	noLeaks(t)
	requireCode(t, ValidateDefectiveConfig(smallConfig(8, 16), NullRole), InvalidArgument, "config.layers[0].buffers[0].role", "is NULL")
	requireCode(t, ValidateDefectiveConfig(smallConfig(8, 16), NullLayers), InvalidArgument, "config.layers", "is NULL but its length is")
	requireCode(t, ValidateDefectiveConfig(smallConfig(8, 16), NullTypicalStepRequests), InvalidArgument,
		"config.typical_step.requests", "is NULL but its length is 1")
}

// TestConfigConversionKeepsNonNullEmptyArrays: a non-NULL array of length 0
// is set (and an empty initial_pool_ratio invalid), unlike NULL (unset).
func TestConfigConversionKeepsNonNullEmptyArrays(t *testing.T) {
	noLeaks(t)
	requireCode(t, ValidateDefectiveConfig(smallConfig(8, 16), EmptyInitialPoolRatio), InvalidConfig, "initial_pool_ratio")
}

// TestConfigConversionReadsOnlyCoveredFields: fields appended after ABI
// version 1 are read only when struct_size covers them.
func TestConfigConversionReadsOnlyCoveredFields(t *testing.T) {
	noLeaks(t)
	require.NoError(t, ValidateDefectiveConfig(smallConfig(8, 16), V2FieldsBeyondV1Size))
	requireCode(t, ValidateDefectiveConfig(smallConfig(8, 16), V2FieldsInvalid), InvalidConfig, "reuse_match_backoff")
}
