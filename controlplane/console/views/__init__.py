"""The console's pages, one module per section of the navigation."""
