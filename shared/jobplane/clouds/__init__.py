"""Cloud adapters. Each module talks to exactly one cloud's SDK; nothing outside this package does."""
