-- dumpdb catalog, schema version 4: payloads dropped by 'dumpdb prune --keep-stats'.
-- The row and its statistics stay; tensor() explains the payload was pruned.
ALTER TABLE tensors ADD COLUMN pruned_at TIMESTAMP;
