"""The vkgate proxy: the request path applications call (built on the control plane's API)."""
