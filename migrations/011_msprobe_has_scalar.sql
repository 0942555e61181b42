-- dumpdb catalog, schema version 11 (issue 29): whether an msprobe record may hold a scalar
-- argument, written at ingest, so that compare's arg_diff column knows a statistics dump holds
-- none without reading the records' text (500,000 records: 0.3 CPU s of a 10 s compare).
-- The test is the one compare made on the text: a record without the key "value" holds no
-- scalar leaf (msprobe writes a scalar as {"type": ..., "value": ...}, formats.md 1.3).
-- Rows written before this version are filled here by the same test; a row NULL here
-- (a part written by an older ingest-worker) is tested on its text when read.
ALTER TABLE msprobe_records ADD COLUMN has_scalar BOOLEAN;
UPDATE msprobe_records SET has_scalar = coalesce(contains(record, '"value"'), false);

COMMENT ON COLUMN msprobe_records.has_scalar IS 'the record text holds the key "value": it may hold a scalar argument (false: it holds none); NULL: not known, test the text';
