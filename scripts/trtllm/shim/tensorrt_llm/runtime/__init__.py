"""See ``tensorrt_llm``: only ``kv_cache_manager_v2`` is here."""
