"""The change feed: every mutation appends an event in its own transaction; proxies long-poll."""
