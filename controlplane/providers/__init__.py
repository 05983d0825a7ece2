"""Model providers: upstream endpoints and their credentials, encrypted at rest."""
