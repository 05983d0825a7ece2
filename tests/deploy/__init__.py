"""Deployment tests: the Helm chart rendered by Helm's engine, and the container's install path."""
