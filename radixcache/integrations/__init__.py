"""radixcache storage inside serving engines.

* ``radixcache.integrations.pagestore``: raw pages under an engine's own keys
  (no engine imports).
* ``radixcache.integrations.tenants``: a request's ``cache_salt`` as a
  radixcache ``Namespace``, and the stored form of a tenant's keys (both
  adapters use it; no engine imports).
* ``radixcache.integrations.vllm``: a vLLM secondary offload tier (imports vLLM).
* ``radixcache.integrations.sglang``: an SGLang HiCache storage backend
  (imports SGLang).

Nothing here is imported by ``import radixcache``; the engine modules import
their engine only when they are imported themselves.
"""
