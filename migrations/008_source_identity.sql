-- dumpdb catalog, schema version 8: the identity of each tensor's source file, so a
-- re-ingest notices a file that changed since (README "Re-ingesting: changed and moved dumps").
-- Size and mtime are compared without reading the file; a difference is confirmed by
-- reading the file and comparing its content hash. Rows ingested before this version
-- have NULL here and are not checked.
ALTER TABLE tensors ADD COLUMN source_size BIGINT;      -- bytes of the file at ingest (st_size)
ALTER TABLE tensors ADD COLUMN source_mtime_ns BIGINT;  -- its modification time (st_mtime_ns)
ALTER TABLE tensors ADD COLUMN previous_hash VARCHAR;   -- content_hash replaced by 'ingest --update'
ALTER TABLE tensors ADD COLUMN updated_at TIMESTAMP;    -- when 'ingest --update' replaced the content

COMMENT ON COLUMN tensors.source_size IS 'Bytes of the source file when it was ingested (st_size; NULL: statistics only or ingested before schema 8)';
COMMENT ON COLUMN tensors.source_mtime_ns IS 'Modification time of the source file when it was ingested, nanoseconds since the epoch (st_mtime_ns)';
COMMENT ON COLUMN tensors.previous_hash IS 'content_hash this tensor had before ingest --update replaced it; that payload stays in the store only until dumpdb gc';
COMMENT ON COLUMN tensors.updated_at IS 'When ingest --update replaced the content of this tensor (NULL: never)';

-- What code_file/code_line/code_text hold, said as it is (issue 19): the innermost frame of
-- the op's trace outside site-packages/dist-packages, or, when the whole trace is inside the
-- framework (loss, TrainOneStepCell and optimizer ops of a graph-mode run), its innermost frame.
COMMENT ON COLUMN ops.code_file IS 'Source file of the innermost # In file frame outside site-packages/dist-packages; when the whole trace lies inside the framework (optimizer, loss ops), the innermost frame, a framework file';
COMMENT ON COLUMN ops.code_line IS 'Line in code_file';
