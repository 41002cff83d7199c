package gen

import (
	"strings"
	"unicode"
)

// Snake converts a Go name to snake_case, keeping acronyms together:
// KVCacheCreate → kv_cache_create, GetAPI → get_api, layerGroupID →
// layer_group_id.
func Snake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) {
			prev := r[i-1]
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// Camel converts snake_case to CamelCase: kv_cache_options → KvCacheOptions.
func Camel(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(s, "_") {
		if part == "" {
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]))
		b.WriteString(part[1:])
	}
	return b.String()
}

// lowerCamel converts snake_case to lowerCamelCase.
func lowerCamel(s string) string {
	c := Camel(s)
	if c == "" {
		return c
	}
	return strings.ToLower(c[:1]) + c[1:]
}

// threadDocs are the sentences the //kvcm:thread keywords stand for.
var threadDocs = map[string]string{
	"any": "Thread-safe; may be called from any thread, also from codec callbacks and host functions.",
	"manager": "Thread-safe: calls on one manager and its caches are serialized by the manager's lock. " +
		"Must not be called from a codec callback or a priority callback of the same manager (the lock is held there).",
	"stream": "Thread-safe; may be called from any thread, including codec callbacks " +
		"(this is how a portable codec enqueues its work on the stream it is given).",
	"handle": "Thread-safe, but no other call may use the handle concurrently or afterwards. " +
		"Must not be called from a codec callback or a priority callback.",
}
