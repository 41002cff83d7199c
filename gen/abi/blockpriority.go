package abi

import "github.com/kvcm/kvcm/gen/spec"

// ManagerSetBlockPriorities sets the eviction priority of the cached blocks
// along a chain: keys are the chained keys of an input's leading full
// blocks in the scope (as kvcm_cp_get_cached_blocks returns them for a
// request, or the key of kvcm_block_event), and keys[i] gets priorities[i]
// as far as the manager holds the chain; out receives how many blocks that
// is (uncached blocks past it are skipped). It is for a scheduler that knows
// which cached blocks its waiting requests will reuse: blocks given a higher
// priority are evicted after those of lower priority, whatever their age,
// where a priority callback decides only when a page is allocated.
//
// Priorities are clamped into [KVCM_MIN_PRIORITY, KVCM_MAX_PRIORITY];
// KVCM_DEFAULT_PRIORITY returns a block nobody waits for to the common
// order. An ancestor never ranks below a descendant: raising a block raises
// the blocks before it to its priority, and lowering one stops at the
// highest priority among the blocks after it. A stored block whose priority changes is reported as
// a KVCM_EVENT_BLOCK_PRIORITY_UPDATED block event. Every layer group's page
// gets the priority.
//
// num_priorities must equal num_keys; otherwise it fails with
// KVCM_ERR_INVALID_ARGUMENT naming priorities, changing nothing.
//
//kvcm:since 2
//kvcm:thread manager
//kvcm:call Core().SetBlockPriorities
//kvcm:param manager in The manager.
//kvcm:param scope borrowed,convert The reuse scope of the blocks.
//kvcm:param hasLoraID in,into=scope.HasLoRA Whether scope.lora_id is a LoRA adapter id, 0 included.
//kvcm:param keys borrowed,nullable,len=numKeys,slice,go=github.com/kvcm/kvcm/core/blockhash.Key The chained block keys, first block first (NULL only when num_keys is 0).
//kvcm:param numKeys in The number of keys.
//kvcm:param priorities borrowed,nullable,len=numPriorities,slice,go=int The priority of each key's block (NULL only when num_priorities is 0).
//kvcm:param numPriorities in The number of priorities (num_keys).
//kvcm:param out out,result Receives the number of cached blocks whose priority was set.
type ManagerSetBlockPriorities func(manager Manager, scope spec.In[ReuseScope], hasLoraID bool, keys spec.In[uint64], numKeys spec.Size, priorities spec.In[int32], numPriorities spec.Size, out spec.Out[spec.Size]) *Status
