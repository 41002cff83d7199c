"""A stand-in for the ``tensorrt_llm`` package that holds only
``tensorrt_llm.runtime.kv_cache_manager_v2``, mapped to kvcm, so that
TensorRT-LLM's own tests for that package run against kvcm unchanged
(scripts/trtllm/run-tests.sh, docs/trtllm.md). Nothing else of TensorRT-LLM
is here: a test importing more of it fails at import."""
