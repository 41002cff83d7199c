package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvcm/kvcm/core/config"
)

// The shared tier's contract: it is optional, comes last, and every error in
// its settings names the field as cache_tiers[i].<field>.

func withShared(s config.SharedCacheTierConfig) config.Config {
	cfg := valid()
	cfg.CacheTiers = append(cfg.CacheTiers, config.Host(1<<20), config.Shared(s))
	return cfg
}

func goodShared() config.SharedCacheTierConfig {
	return config.SharedCacheTierConfig{Addresses: []string{"127.0.0.1:7101", "[::1]:7102"}, Namespace: "prod-a",
		TTL: time.Hour, CallTimeout: time.Second}
}

// A shared tier after the local tiers validates; LocalTiers leaves it out.
func TestSharedTierIsOptionalAndLast(t *testing.T) {
	cfg := withShared(goodShared())
	require.NoError(t, cfg.Validate(1))
	assert.Equal(t, []config.CacheTierConfig{config.GPU(1 << 20), config.Host(1 << 20)}, cfg.LocalTiers())
	assert.Len(t, cfg.CacheTiers, 3, "LocalTiers does not change the configuration")

	early := valid()
	early.CacheTiers = append(early.CacheTiers, config.Shared(goodShared()), config.Host(1<<20))
	requireField(t, early.Validate(1), "cache_tiers[2].kind", "shared")
}

// Every error names its field: each bad shared setting is reported at its
// path in the tier list.
func TestSharedTierErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*config.CacheTierConfig)
	}{
		{"cache_tiers[2].shared", func(c *config.CacheTierConfig) { c.Shared = nil }},
		{"cache_tiers[2].quota", func(c *config.CacheTierConfig) { c.Quota = 1 }},
		{"cache_tiers[2].path", func(c *config.CacheTierConfig) { c.Path = "/tmp" }},
		{"cache_tiers[2].max_quota", func(c *config.CacheTierConfig) { c.MaxQuota = 1 }},
		{"cache_tiers[2].addresses", func(c *config.CacheTierConfig) { c.Shared.Addresses = nil }},
		{"cache_tiers[2].addresses[1]", func(c *config.CacheTierConfig) { c.Shared.Addresses[1] = "localhost" }},
		{"cache_tiers[2].addresses[0]", func(c *config.CacheTierConfig) { c.Shared.Addresses[0] = ":7101" }},
		{"cache_tiers[2].addresses[0]", func(c *config.CacheTierConfig) { c.Shared.Addresses[0] = "h:99999" }},
		{"cache_tiers[2].addresses[0]", func(c *config.CacheTierConfig) { c.Shared.Addresses[0] = "h\x00:1" }},
		{"cache_tiers[2].namespace", func(c *config.CacheTierConfig) { c.Shared.Namespace = "" }},
		{"cache_tiers[2].namespace", func(c *config.CacheTierConfig) { c.Shared.Namespace = "a{b}" }},
		{"cache_tiers[2].namespace", func(c *config.CacheTierConfig) { c.Shared.Namespace = "a b" }},
		{"cache_tiers[2].ttl", func(c *config.CacheTierConfig) { c.Shared.TTL = -time.Second }},
		{"cache_tiers[2].ttl", func(c *config.CacheTierConfig) { c.Shared.TTL = time.Microsecond }},
		{"cache_tiers[2].dial_timeout", func(c *config.CacheTierConfig) { c.Shared.DialTimeout = -1 }},
		{"cache_tiers[2].call_timeout", func(c *config.CacheTierConfig) { c.Shared.CallTimeout = -1 }},
		{"cache_tiers[2].write_policy", func(c *config.CacheTierConfig) { c.Shared.WritePolicy = 7 }},
		{"cache_tiers[2].queue_bytes", func(c *config.CacheTierConfig) { c.Shared.QueueBytes = -1 }},
	} {
		cfg := withShared(goodShared())
		s := *cfg.CacheTiers[2].Shared
		s.Addresses = append([]string(nil), s.Addresses...)
		cfg.CacheTiers[2].Shared = &s
		tc.edit(&cfg.CacheTiers[2])
		requireField(t, cfg.Validate(1), tc.field)
	}
}

// Only a shared tier carries shared settings.
func TestSharedSettingsOnlyOnASharedTier(t *testing.T) {
	cfg := valid()
	s := goodShared()
	cfg.CacheTiers[0].Shared = &s
	requireField(t, cfg.Validate(1), "cache_tiers[0].shared")
}
