"""Output for people and tools: terminal tables, msprobe-compatible CSV/Parquet, HTML reports."""
