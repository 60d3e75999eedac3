"""The embedded SQLite target: PRAGMAs on a real database file, and its workload."""
