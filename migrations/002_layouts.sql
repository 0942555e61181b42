-- dumpdb catalog, schema version 2: columns and relations for every dump layout
-- (CANN protobuf dumps, TorchAir, msprobe, device formats). See README "Catalog schema".

-- Identity of a tensor within its run, as the dump names it: the file for one-tensor
-- files; file + '#' + a suffix where one file holds several tensors (protobuf .bin,
-- statistic.csv, msprobe dump.json). Ingest is idempotent on (run, tensor_key).
ALTER TABLE tensors ADD COLUMN tensor_key VARCHAR;
UPDATE tensors SET tensor_key = CASE
    WHEN content_hash IS NULL
        THEN source_file || '#' || coalesce(op_type, '') || '.' || coalesce(op_name, '') || '.'
             || coalesce(CAST(task_id AS VARCHAR), '') || '.' || coalesce(CAST(stream_id AS VARCHAR), '') || '.'
             || coalesce(CAST(timestamp AS VARCHAR), '') || '.' || coalesce(io, '') || '.'
             || coalesce(CAST(slot AS VARCHAR), '')
    ELSE source_file END;

ALTER TABLE tensors ADD COLUMN device_id INTEGER;        -- {device_id} directory (CANN/Ascend layouts)
ALTER TABLE tensors ADD COLUMN model_name VARCHAR;       -- {model_name} directory (GE graph name)
ALTER TABLE tensors ADD COLUMN model_id BIGINT;          -- {model_id} directory
ALTER TABLE tensors ADD COLUMN step BIGINT;              -- user-side step ({step_id}, msprobe step{N})
ALTER TABLE tensors ADD COLUMN original_shape BIGINT[];  -- host shape of a device-format tensor
ALTER TABLE tensors ADD COLUMN original_format VARCHAR;  -- host format of a device-format tensor
ALTER TABLE tensors ADD COLUMN direction VARCHAR;        -- 'forward' | 'backward' (msprobe)
ALTER TABLE tensors ADD COLUMN call_index INTEGER;       -- n-th call of the API/module (msprobe)
ALTER TABLE tensors ADD COLUMN arg_name VARCHAR;         -- keyword or parameter name (msprobe kwargs, weight, bias)
ALTER TABLE tensors ADD COLUMN slot_path VARCHAR;        -- full index of a nested argument, e.g. '0.1'
ALTER TABLE tensors ADD COLUMN requires_grad BOOLEAN;    -- msprobe

-- Graphs are per device in layouts without ranks (MindSpore r1.2: device_{id}/graphs).
ALTER TABLE ops ADD COLUMN device_id INTEGER;
ALTER TABLE execution_order ADD COLUMN device_id INTEGER;
ALTER TABLE graph_executions ADD COLUMN device_id INTEGER;

-- Overflow records: Opdebug.Node_OpDebug.* files (seed 001; reference formats.md 3.4).
CREATE TABLE overflows (
    run         VARCHAR NOT NULL,
    rank        INTEGER,
    device_id   INTEGER,
    iteration   BIGINT,
    op_type     VARCHAR,
    op_name     VARCHAR,
    task_id     BIGINT,
    stream_id   BIGINT,
    timestamp   BIGINT,
    slot        INTEGER,
    source_file VARCHAR NOT NULL,
    content     JSON                 -- the record as the dump states it
);

-- Call stacks (msprobe stack.json): one row per op name sharing a stack.
CREATE TABLE call_stacks (
    run       VARCHAR NOT NULL,
    rank      INTEGER,
    iteration BIGINT,
    stack_id  VARCHAR,
    op_name   VARCHAR,
    frames    VARCHAR[]
);

-- Module hierarchy (msprobe construct.json): node -> parent module node (NULL at the top).
CREATE TABLE module_tree (
    run       VARCHAR NOT NULL,
    rank      INTEGER,
    iteration BIGINT,
    node      VARCHAR,
    parent    VARCHAR
);
