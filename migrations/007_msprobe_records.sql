-- dumpdb catalog, schema version 7: msprobe dump.json records kept whole, in dump order.
-- They carry what the tensors table does not: non-tensor arguments (ints, slices, strings,
-- None gradients) and the order msprobe wrote the records in (its execution order), which
-- `compare --csv` needs to write msprobe's compare_result rows (reference formats.md 1.3, 2.1).
CREATE TABLE msprobe_records (
    run       VARCHAR NOT NULL,
    rank      INTEGER,           -- R of rank{R}; NULL under proc{PID}
    iteration BIGINT,            -- N of step{N}
    position  INTEGER NOT NULL,  -- 0-based index of the record in dump.json "data"
    op_name   VARCHAR NOT NULL,  -- the record key, e.g. Functional.conv2d.0.forward
    record    JSON               -- the record as dumped
);

COMMENT ON TABLE msprobe_records IS 'msprobe dump.json records kept whole, in dump order (non-tensor arguments included)';
COMMENT ON COLUMN msprobe_records.run IS 'run name';
COMMENT ON COLUMN msprobe_records.rank IS 'R of rank{R}; NULL under proc{PID}';
COMMENT ON COLUMN msprobe_records.iteration IS 'N of step{N}';
COMMENT ON COLUMN msprobe_records.position IS '0-based index of the record in dump.json "data"';
COMMENT ON COLUMN msprobe_records.op_name IS 'the record key, e.g. Functional.conv2d.0.forward';
COMMENT ON COLUMN msprobe_records.record IS 'the record as dumped (JSON)';
