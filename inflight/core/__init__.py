"""The tensor-free core: block pool, KV-cache manager, scheduler. Plain Python over integers."""
