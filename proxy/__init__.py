"""The request path: the `/v1` API applications call with a `vk-` key."""
