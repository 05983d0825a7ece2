"""What an operator sees of the proxy: metrics, request logs and traces."""
