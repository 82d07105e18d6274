"""The reference executor over numpy (SPEC §12): long_sequence(), tables, CTAS, INSERT."""
