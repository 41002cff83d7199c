// Package sharedtier owns kvcm's cold tier shared across nodes: a
// content-addressed store of opaque blobs on a Redis Cluster.
//
// A blob is found by its Key (the store's namespace, the layout fingerprint,
// the lifecycle and the block key), so another process or node with the same
// layout reuses it. The store never looks inside a blob: it is the disk
// tier's cold blob, copied raw; the Verify callback (the blob format's
// header and checksum check) decides whether bytes that came back are the
// blob asked for.
//
// Every fault is a miss and a counted error, never wrong bytes and never a
// hang: each call runs under Options.CallTimeout; a node down, a timeout, a
// redirection during resharding that the client could not follow, a key the
// cluster evicted or expired, and a blob Verify rejects all read as misses.
// The client follows MOVED/ASK and refreshes its slot map on its own, and the
// store reconnects on its own when the cluster was unreachable at Open.
//
// The manager-facing API is small:
//
//   - MatchPrefix(keys) — how many leading keys of a chain the tier holds,
//     one pipelined round trip per batch of Options.LookupBatchKeys keys;
//   - Get(keys) — the blobs, verified, one round trip per batch;
//   - Put(key, blob) — an asynchronous write through a bounded queue that
//     never blocks (a full queue drops and counts); keys already in the
//     cluster or already queued are not written again. Each writer keeps
//     one pipelined round trip in flight, which writes a batch (SET NX of
//     the keys its EXISTS found missing) and asks EXISTS of the next: one
//     round trip a batch, as a raw pipelined SET;
//   - Flush, Stats, Close.
//
// When the manager calls Put is its write policy (config.SharedWritePolicy):
// write-back on eviction from the last local level by default, write-through
// on commit as an option.
//
// The manager's side is core/sharedlevel.go: it opens the store from
// OptionsFrom(the shared tier's config) with a Verify of the blob format,
// continues create_kv_cache's, probe_reuse's and
// probe_first_new_block_key's prefix match with MatchPrefix (and
// create_kv_cache's fetch with Get) outside its lock, and Puts blobs on
// eviction from the last local level or on commit.
package sharedtier

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvcm/kvcm/core/config"
	"github.com/redis/rueidis"
)

// Fingerprint is a layout fingerprint, opaque here: the blob format defines
// it (16 bytes, as the disk tier's blob header carries it), and two managers
// share blobs only when theirs are equal.
type Fingerprint [16]byte

// Key addresses one blob: the layout's Fingerprint, the Lifecycle (layer
// group) and the Block's chain key (blockhash.Key).
type Key struct {
	Fingerprint Fingerprint
	Lifecycle   uint32
	Block       uint64
}

// Defaults for the zero fields of Options.
const (
	DefaultDialTimeout     = 2 * time.Second
	DefaultCallTimeout     = 2 * time.Second
	DefaultBatchKeys       = 64
	DefaultLookupBatchKeys = 512
	DefaultQueueBlobs      = 1024
	DefaultQueueBytes      = 256 << 20
	DefaultWriters         = 2
	DefaultReconnectPeriod = time.Second
)

// Options configure a Store. Only Addresses and Namespace are required.
type Options struct {
	// Addresses are seed nodes of the cluster, host:port; the client
	// discovers the others.
	Addresses []string
	// Namespace prefixes every key, so that deployments (or tests) sharing a
	// cluster do not see each other's blobs (config.ValidateNamespace: no
	// brace, which would make a hash tag and pin every key to one slot).
	Namespace string
	// TTL is set on every blob written; 0 writes without expiry (the
	// cluster's maxmemory policy then bounds the tier).
	TTL time.Duration
	// DialTimeout bounds connecting to a node; CallTimeout bounds every
	// call of MatchPrefix and Get (all its round trips together) and every
	// batch a writer sends. Zero selects the defaults.
	DialTimeout, CallTimeout time.Duration
	// BatchKeys is the number of keys of one pipelined round trip of Get
	// and of the writers; LookupBatchKeys that of MatchPrefix, whose
	// replies are a few bytes a key.
	BatchKeys, LookupBatchKeys int
	// QueueBlobs and QueueBytes bound the write queue; a Put beyond either
	// is dropped and counted.
	QueueBlobs int
	QueueBytes int64
	// Writers is the number of goroutines writing the queue to the cluster.
	Writers int
	// Verify, when set, checks a blob read back (its header names key, its
	// checksum matches); an error makes it a miss counted in Stats.Corrupt.
	// Get calls it from several goroutines at once.
	Verify func(key Key, blob []byte) error
}

// Stats are the store's counters since Open.
type Stats struct {
	Lookups      int64 // keys asked for by MatchPrefix and Get
	Hits         int64 // keys found (and, for Get, verified)
	Misses       int64 // keys not found, or lost to an error
	Errors       int64 // errors: a key or a round trip lost to one (its keys are misses or write errors)
	Timeouts     int64 // errors that were CallTimeout running out (also in Errors)
	Corrupt      int64 // blobs Verify rejected (each also a miss)
	BytesRead    int64
	Queued       int64 // Puts accepted into the queue
	Dropped      int64 // Puts dropped: the queue was full or the store closed
	Deduplicated int64 // Puts not queued: the key was already queued
	Present      int64 // queued writes skipped: the key was already in the cluster
	Written      int64 // blobs written
	WriteErrors  int64 // queued writes lost to an error
	BytesWritten int64
}

// ErrUnavailable is returned while no connection to the cluster could be made.
var ErrUnavailable = errors.New("sharedtier: cluster unavailable")

type pending struct {
	key  Key
	name string
	blob []byte
}

// Store is a shared tier's client. Its methods are safe for concurrent use.
type Store struct {
	opts   Options
	prefix string

	client   atomic.Pointer[rueidis.Client]
	dialMu   sync.Mutex // held while dialing; calls meanwhile are misses
	lastDial time.Time  // guarded by dialMu

	mu        sync.Mutex // guards closed, queued, idle; never held across I/O
	closed    bool
	queued    map[string]struct{} // keys in the queue or being written
	idle      []chan struct{}     // Flush waiters, closed when queued empties
	queue     chan pending
	queueSize atomic.Int64 // bytes in the queue
	writers   sync.WaitGroup

	stats struct {
		lookups, hits, misses, errors, timeouts, corrupt, bytesRead         atomic.Int64
		queued, dropped, dedup, present, written, writeErrors, bytesWritten atomic.Int64
	}
}

// Validate checks opts, naming the offending field.
func (o *Options) Validate() error {
	if len(o.Addresses) == 0 {
		return fmt.Errorf("addresses: needs at least one seed address")
	}
	for i, a := range o.Addresses {
		if _, port, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("addresses[%d]: %q is not host:port: %v", i, a, err)
		} else if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("addresses[%d]: %q has no valid port", i, a)
		}
	}
	if err := config.ValidateNamespace(o.Namespace); err != nil {
		return fmt.Errorf("namespace: %v", err)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"ttl", int64(o.TTL)}, {"dial_timeout", int64(o.DialTimeout)}, {"call_timeout", int64(o.CallTimeout)},
		{"batch_keys", int64(o.BatchKeys)}, {"lookup_batch_keys", int64(o.LookupBatchKeys)}, {"queue_blobs", int64(o.QueueBlobs)}, {"queue_bytes", o.QueueBytes},
		{"writers", int64(o.Writers)}} {
		if f.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %d", f.name, f.v)
		}
	}
	if o.TTL > 0 && o.TTL < time.Millisecond {
		return fmt.Errorf("ttl: must be at least 1ms, got %v", o.TTL)
	}
	return nil
}

func (o *Options) withDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	def(&o.BatchKeys, DefaultBatchKeys)
	def(&o.LookupBatchKeys, DefaultLookupBatchKeys)
	def(&o.QueueBlobs, DefaultQueueBlobs)
	def(&o.Writers, DefaultWriters)
}

// OptionsFrom returns the Options of a shared tier's configuration
// (validated by config.Config.Validate).
func OptionsFrom(c config.SharedCacheTierConfig) Options {
	return Options{
		Addresses:   append([]string(nil), c.Addresses...),
		Namespace:   c.Namespace,
		TTL:         c.TTL,
		DialTimeout: c.DialTimeout,
		CallTimeout: c.CallTimeout,
		QueueBytes:  c.QueueBytes,
	}
}

// Open validates opts and starts a store. An unreachable cluster is not an
// error: the store reconnects on its own, and calls are misses until then.
func Open(opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("sharedtier: %w", err)
	}
	opts.withDefaults()
	opts.Addresses = append([]string(nil), opts.Addresses...)
	s := &Store{
		opts:   opts,
		prefix: "kvcm:" + opts.Namespace + ":",
		queued: make(map[string]struct{}),
		queue:  make(chan pending, opts.QueueBlobs),
	}
	s.connect()
	for range opts.Writers {
		s.writers.Add(1)
		go s.writer()
	}
	return s, nil
}

// KeyName is the cluster key of k in this store's namespace: no hash tag,
// so a chain's blobs spread over every slot.
func (s *Store) KeyName(k Key) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + 64)
	b.WriteString(s.prefix)
	b.WriteString(hex.EncodeToString(k.Fingerprint[:]))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(uint64(k.Lifecycle), 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(k.Block, 16))
	return b.String()
}

// connect returns the client, or nil while there is none. It dials at most
// once a DefaultReconnectPeriod, and a caller that finds another dialing
// does not wait for it. Once made, the client reconnects to failed nodes by
// itself.
func (s *Store) connect() rueidis.Client {
	if c := s.client.Load(); c != nil {
		return *c
	}
	if !s.dialMu.TryLock() {
		return nil
	}
	defer s.dialMu.Unlock()
	if c := s.client.Load(); c != nil {
		return *c
	}
	if s.isClosed() || (!s.lastDial.IsZero() && time.Since(s.lastDial) < DefaultReconnectPeriod) {
		return nil
	}
	s.lastDial = time.Now()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:      s.opts.Addresses,
		ShuffleInit:      true,
		DisableCache:     true,
		Dialer:           net.Dialer{Timeout: s.opts.DialTimeout},
		ConnWriteTimeout: s.opts.CallTimeout,
	})
	if err != nil {
		return nil
	}
	s.client.Store(&c)
	return c
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Store) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.CallTimeout)
}

// countErr counts one failed round trip or key.
func (s *Store) countErr(err error) {
	s.stats.errors.Add(1)
	if errors.Is(err, context.DeadlineExceeded) {
		s.stats.timeouts.Add(1)
	}
}

// MatchPrefix returns how many leading keys of keys the tier holds, asking
// one pipelined round trip of EXISTS per batch of Options.LookupBatchKeys keys and
// stopping at the first batch with a miss. Errors make the match end there
// (they are counted and returned with the length matched so far). A key
// found here may still be evicted before Get: the caller treats Get's misses
// as the end of the match.
func (s *Store) MatchPrefix(ctx context.Context, keys []Key) (int, error) {
	c := s.connect()
	if c == nil {
		s.missAll(len(keys))
		return 0, ErrUnavailable
	}
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	matched := 0
	for start := 0; start < len(keys); start += s.opts.LookupBatchKeys {
		batch := keys[start:min(start+s.opts.LookupBatchKeys, len(keys))]
		cmds := make(rueidis.Commands, len(batch))
		for i, k := range batch {
			cmds[i] = c.B().Exists().Key(s.KeyName(k)).Build()
		}
		res := c.DoMulti(ctx, cmds...)
		s.stats.lookups.Add(int64(len(batch)))
		for i, r := range res {
			n, err := r.AsInt64()
			if err != nil || n != 1 {
				s.stats.hits.Add(int64(i))
				s.stats.misses.Add(int64(len(batch) - i))
				s.stats.lookups.Add(int64(len(keys) - start - len(batch)))
				s.stats.misses.Add(int64(len(keys) - start - len(batch)))
				if err != nil {
					s.countErr(err)
					return matched + i, fmt.Errorf("sharedtier: exists: %w", err)
				}
				return matched + i, nil
			}
		}
		s.stats.hits.Add(int64(len(batch)))
		matched += len(batch)
	}
	return matched, nil
}

func (s *Store) missAll(n int) {
	s.stats.lookups.Add(int64(n))
	s.stats.misses.Add(int64(n))
	s.countErr(ErrUnavailable)
}

// GetDepth is how many of a Get's round trips are in flight at once: the
// next batches are on the wire while one batch's blobs are checked (Verify).
const GetDepth = 4

// Get returns the blobs of keys, one pipelined round trip of GET per batch of
// Options.BatchKeys keys, up to GetDepth of them at once: blobs[i] is nil
// where keys[i] is missing, failed or rejected by Verify (which runs on
// several goroutines at once). The error is the first round-trip or key
// error, in key order, if any; the blobs found are returned with it.
func (s *Store) Get(ctx context.Context, keys []Key) ([][]byte, error) {
	blobs := make([][]byte, len(keys))
	c := s.connect()
	if c == nil {
		s.missAll(len(keys))
		return blobs, ErrUnavailable
	}
	ctx, cancel := s.callCtx(ctx)
	defer cancel()
	bk := s.opts.BatchKeys
	errs := make([]error, (len(keys)+bk-1)/bk)
	slots := make(chan struct{}, GetDepth)
	var wg sync.WaitGroup
	for b := range errs {
		lo, hi := b*bk, min((b+1)*bk, len(keys))
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[b] = s.getBatch(ctx, c, keys[lo:hi], blobs[lo:hi])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return blobs, err
		}
	}
	return blobs, nil
}

// getBatch is one round trip of Get: the blobs of batch into out.
func (s *Store) getBatch(ctx context.Context, c rueidis.Client, batch []Key, out [][]byte) error {
	cmds := make(rueidis.Commands, len(batch))
	for i, k := range batch {
		cmds[i] = c.B().Get().Key(s.KeyName(k)).Build()
	}
	res := c.DoMulti(ctx, cmds...)
	s.stats.lookups.Add(int64(len(batch)))
	var first error
	for i, r := range res {
		b, err := r.AsBytes()
		switch {
		case rueidis.IsRedisNil(err):
			s.stats.misses.Add(1)
			continue
		case err != nil:
			s.stats.misses.Add(1)
			s.countErr(err)
			if first == nil {
				first = fmt.Errorf("sharedtier: get: %w", err)
			}
			continue
		}
		if s.opts.Verify != nil {
			if err := s.opts.Verify(batch[i], b); err != nil {
				s.stats.misses.Add(1)
				s.stats.corrupt.Add(1)
				if first == nil {
					first = fmt.Errorf("sharedtier: blob %s: %w", s.KeyName(batch[i]), err)
				}
				continue
			}
		}
		s.stats.hits.Add(1)
		s.stats.bytesRead.Add(int64(len(b)))
		out[i] = b
	}
	return first
}

// Put queues blob to be written under key and returns at once: false when it
// was dropped (the queue is full in blobs or bytes, or the store is closed)
// or the key is already queued. The store keeps blob until it is written:
// the caller must not modify it after Put. A key the cluster already holds
// is not written again.
func (s *Store) Put(key Key, blob []byte) bool {
	name := s.KeyName(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.stats.dropped.Add(1)
		return false
	}
	if _, dup := s.queued[name]; dup {
		s.stats.dedup.Add(1)
		return false
	}
	if s.queueSize.Load()+int64(len(blob)) > s.opts.QueueBytes {
		s.stats.dropped.Add(1)
		return false
	}
	select {
	case s.queue <- pending{key: key, name: name, blob: blob}:
	default:
		s.stats.dropped.Add(1)
		return false
	}
	s.queued[name] = struct{}{}
	s.queueSize.Add(int64(len(blob)))
	s.stats.queued.Add(1)
	return true
}

// writer drains the queue in batches of up to Options.BatchKeys keys (and
// writeBatchBytes), with one pipelined round trip a batch, as a raw
// pipelined SET has: the round trip that writes a batch (SET NX, with the
// TTL, of the keys its EXISTS found missing) also carries the EXISTS of the
// next batch, taken from the queue as it is sent. A writer thus keeps one
// round trip in flight, and only a batch taken while the writer had nothing
// to write waits for a round trip of EXISTS alone.
func (s *Store) writer() {
	defer s.writers.Done()
	var sets []pending // keys found missing, to write in the next round trip
	for {
		next := s.take(len(sets) == 0)
		if len(sets)+len(next) == 0 {
			return // the queue is closed and drained
		}
		sets = s.roundTrip(sets, next)
	}
}

// writeBatchBytes bounds the blob bytes of one writer's batch.
const writeBatchBytes = 16 << 20

// take returns the next batch of the queue: when wait is set, at least its
// first key, waiting for it (none once the queue is closed and drained);
// otherwise only what is queued now.
func (s *Store) take(wait bool) []pending {
	var batch []pending
	bytes := 0
	if wait {
		p, ok := <-s.queue
		if !ok {
			return nil
		}
		batch, bytes = append(batch, p), len(p.blob)
	}
	for len(batch) < s.opts.BatchKeys && bytes < writeBatchBytes {
		select {
		case p, ok := <-s.queue:
			if !ok {
				return batch
			}
			batch, bytes = append(batch, p), bytes+len(p.blob)
		default:
			return batch
		}
	}
	return batch
}

// roundTrip is one pipelined round trip of a writer: SET NX of sets and
// EXISTS of next. It releases sets and the keys of next it is done with
// (present, or lost to an error: a write error) and returns the others,
// which the cluster lacks.
func (s *Store) roundTrip(sets, next []pending) (missing []pending) {
	c := s.connect()
	if c == nil {
		s.stats.writeErrors.Add(int64(len(sets) + len(next)))
		s.countErr(ErrUnavailable)
		s.release(sets, next)
		return nil
	}
	ctx, cancel := s.callCtx(context.Background())
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(sets)+len(next))
	for _, p := range sets {
		set := c.B().Set().Key(p.name).Value(rueidis.BinaryString(p.blob)).Nx()
		if s.opts.TTL > 0 {
			cmds = append(cmds, set.PxMilliseconds(s.opts.TTL.Milliseconds()).Build())
		} else {
			cmds = append(cmds, set.Build())
		}
	}
	for _, p := range next {
		cmds = append(cmds, c.B().Exists().Key(p.name).Build())
	}
	res := c.DoMulti(ctx, cmds...)
	for i, r := range res[:len(sets)] {
		err := r.Error()
		switch {
		case rueidis.IsRedisNil(err): // NX: another node wrote it meanwhile
			s.stats.present.Add(1)
		case err != nil:
			s.stats.writeErrors.Add(1)
			s.countErr(err)
		default:
			s.stats.written.Add(1)
			s.stats.bytesWritten.Add(int64(len(sets[i].blob)))
		}
	}
	var settled []pending
	for i, r := range res[len(sets):] {
		n, err := r.AsInt64()
		switch {
		case err != nil:
			s.stats.writeErrors.Add(1)
			s.countErr(err)
		case n == 1:
			s.stats.present.Add(1)
		default:
			missing = append(missing, next[i])
			continue
		}
		settled = append(settled, next[i])
	}
	s.release(sets, settled)
	return missing
}

// release takes the keys of batches out of the queue's accounting, once
// they are written or failed, and wakes Flush when none is left.
func (s *Store) release(batches ...[]pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range batches {
		for _, p := range b {
			delete(s.queued, p.name)
			s.queueSize.Add(-int64(len(p.blob)))
		}
	}
	if len(s.queued) == 0 {
		for _, ch := range s.idle {
			close(ch)
		}
		s.idle = nil
	}
}

// Flush waits until every queued write has been written or failed, or ctx
// is done.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	if len(s.queued) == 0 {
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	s.idle = append(s.idle, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	st := &s.stats
	return Stats{
		Lookups: st.lookups.Load(), Hits: st.hits.Load(), Misses: st.misses.Load(),
		Errors: st.errors.Load(), Timeouts: st.timeouts.Load(), Corrupt: st.corrupt.Load(),
		BytesRead: st.bytesRead.Load(), Queued: st.queued.Load(), Dropped: st.dropped.Load(),
		Deduplicated: st.dedup.Load(), Present: st.present.Load(), Written: st.written.Load(),
		WriteErrors: st.writeErrors.Load(), BytesWritten: st.bytesWritten.Load(),
	}
}

// Close stops accepting writes, waits for the queued ones (each batch
// bounded by CallTimeout) and closes the connections.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	s.writers.Wait()
	s.dialMu.Lock() // a dial in progress ends first, and none starts after
	defer s.dialMu.Unlock()
	if c := s.client.Swap(nil); c != nil {
		(*c).Close()
	}
	return nil
}
