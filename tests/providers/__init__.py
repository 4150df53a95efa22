"""Provider adapter tests, run against a strict local HTTP server."""
