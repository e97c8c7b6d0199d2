"""radixcache storage inside serving engines.

* ``radixcache.integrations.pagestore``: raw pages under an engine's own keys
  (no engine imports).
* ``radixcache.integrations.raw_pages``: the page buffers and tickets of a
  ``PageStore`` (no engine imports).
* ``radixcache.integrations.quotas``: per-tenant quotas and retention of a
  page store, from the adapters' ``quotas`` setting (no engine imports).
* ``radixcache.integrations.tenants``: a request's ``cache_salt`` as a
  radixcache ``Namespace``, and the stored form of a tenant's keys (both
  adapters use it; no engine imports).
* ``radixcache.integrations.vllm``: a vLLM secondary offload tier (imports vLLM).
* ``radixcache.integrations.sglang``: an SGLang HiCache storage backend
  (imports SGLang).

Nothing here is imported by ``import radixcache``; the engine modules import
their engine only when they are imported themselves.
"""
