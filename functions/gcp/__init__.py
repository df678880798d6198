"""Google Cloud Functions (gen2) entry points."""
