"""The internal API the proxies call: resolve-key, config bundles, the change feed, health."""
