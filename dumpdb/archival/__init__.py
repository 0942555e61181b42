"""Long-term keeping: export/import bundles, verify, prune, rm, gc."""
