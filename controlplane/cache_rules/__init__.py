"""Response-cache rules: which keys' requests for which models are answered from the cache."""
