"""The tensor store: packs of small payloads, one array per large payload, shard encoding."""
