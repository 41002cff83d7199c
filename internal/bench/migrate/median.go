package migrate

import (
	"slices"
	"time"
)

// median is the median of d (the mean of the middle two for an even count);
// shared by the GPU and the emulated runs.
func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
