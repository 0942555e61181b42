-- dumpdb catalog, schema version 9 (issue 13): a payload may be stored as a delta, the XOR
-- of its bytes with those of an earlier payload of the same pack (dumpdb/storage/delta.py).
-- content_hash stays the hash of the plain payload, so dedup and verify are unchanged; the
-- pack's zarr.json lists its delta payloads (attribute dumpdb.xor) for readers of the store.
ALTER TABLE blobs ADD COLUMN base_hash VARCHAR;  -- the base payload's content_hash (NULL: stored plain)

COMMENT ON COLUMN blobs.base_hash IS 'Stored as a delta: the payload bytes XOR those of this content_hash, a plain payload earlier in the same pack (array_path); the reader XORs them back. NULL: stored plain';
