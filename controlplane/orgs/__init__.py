"""Organizations, teams and projects: who owns keys and spend."""
