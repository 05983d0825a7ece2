"""Admin tokens (roles `admin` and `finance`) and the audit log of what they changed."""
