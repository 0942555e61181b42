-- dumpdb catalog, schema version 1.
-- Applied by dumpdb.catalog in a transaction; recorded in schema_version.
-- Column names follow the dump documents (rank_id -> rank, net_name, graph_id,
-- iteration, op_type, op_name, task_id, stream_id, timestamp, io, slot, format,
-- dtype, shape). See README "Catalog schema".

CREATE TABLE schema_version (
    version        INTEGER PRIMARY KEY,
    name           VARCHAR NOT NULL,
    applied_at     TIMESTAMP NOT NULL DEFAULT current_timestamp,
    dumpdb_version VARCHAR
);

-- One row per ingested dump.
CREATE TABLE runs (
    run               VARCHAR PRIMARY KEY,
    source_path       VARCHAR NOT NULL,   -- absolute path of DUMP_DIR at ingest
    layout            VARCHAR NOT NULL,   -- e.g. 'mindspore-sync'
    framework         VARCHAR,            -- e.g. 'MindSpore'
    framework_version VARCHAR,            -- from .dump_metadata/config.json ms_version
    device_target     VARCHAR,            -- from .dump_metadata/config.json
    dump_config       JSON,               -- .dump_metadata/data_dump.json, verbatim
    metadata          JSON,               -- other metadata files, by relative path
    status            VARCHAR NOT NULL,   -- ingesting | complete | complete_with_errors | interrupted
    ingest_started    TIMESTAMP NOT NULL,
    ingest_finished   TIMESTAMP,
    dumpdb_version    VARCHAR NOT NULL
);

CREATE SEQUENCE tensor_id_seq START 1;

-- One row per dumped tensor.
CREATE TABLE tensors (
    tensor_id      BIGINT PRIMARY KEY,
    run            VARCHAR NOT NULL,
    rank           INTEGER,
    net_name       VARCHAR,
    graph_id       INTEGER,
    iteration      BIGINT,             -- NULL for constants/
    op_type        VARCHAR,
    op_name        VARCHAR,            -- as in the file name, after mapping.csv
    scope_name     VARCHAR,            -- full '/' name from IR / execution order
    task_id        BIGINT,
    stream_id      BIGINT,
    timestamp      BIGINT,             -- as dumped (MindSpore: microseconds since epoch)
    io             VARCHAR,            -- 'input' | 'output'
    slot           INTEGER,
    format         VARCHAR,            -- e.g. 'DefaultFormat', 'NC1HWC0'
    dtype          VARCHAR,            -- numpy name of what the bytes are
    dtype_declared VARCHAR,            -- as the dump names it, e.g. 'Float16'
    shape          BIGINT[],
    nbytes         BIGINT,             -- payload bytes
    source_file    VARCHAR NOT NULL,   -- relative to DUMP_DIR, as on disk
    content_hash   VARCHAR,            -- xxh3-128 of the payload (hex); key of blobs
    min            DOUBLE,
    max            DOUBLE,
    mean           DOUBLE,
    l2norm         DOUBLE,
    count          BIGINT,
    nan_count      BIGINT,
    pos_inf_count  BIGINT,
    neg_inf_count  BIGINT,
    zero_count     BIGINT,
    stats_source   VARCHAR,            -- 'computed' | 'statistic.csv' | 'computed+statistic.csv'
    checksum       VARCHAR,            -- checksum the dump itself recorded (e.g. MD5 column)
    checksum_algo  VARCHAR,
    note           VARCHAR             -- quirks found while reading the file
);

-- Stored tensor content, one row per distinct payload (deduplication).
CREATE TABLE blobs (
    content_hash VARCHAR PRIMARY KEY,
    nbytes       BIGINT NOT NULL,
    array_path   VARCHAR,              -- Zarr array inside tensors.zarr; NULL for empty payloads
    elem_offset  BIGINT,               -- first element in a pack array; NULL: whole array
    elem_count   BIGINT,               -- elements (of the array's dtype) it spans
    stored_bytes BIGINT,               -- compressed bytes on disk (apportioned within a pack)
    first_run    VARCHAR,              -- run whose ingest stored it
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- Zarr arrays of the tensor store.
CREATE TABLE arrays (
    array_path   VARCHAR PRIMARY KEY,
    kind         VARCHAR NOT NULL,     -- 'pack' (1-D, many tensors) | 'tensor' (one large tensor)
    dtype        VARCHAR NOT NULL,     -- Zarr dtype of the array
    shape        BIGINT[] NOT NULL,
    stored_bytes BIGINT,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp
);

-- Graph nodes from graphs/ms_output_trace_code_graph_{graph_id}.ir.
CREATE TABLE ops (
    run           VARCHAR NOT NULL,
    rank          INTEGER,
    graph_id      INTEGER,
    scope_name    VARCHAR,             -- '# Fullname with scope'
    op_type       VARCHAR,             -- primitive, PrimFunc_ prefix removed
    ir_op_type    VARCHAR,             -- primitive as written in the IR
    node          VARCHAR,             -- IR node id, e.g. '%1'
    input_shapes  BIGINT[][],
    input_dtypes  VARCHAR[],
    output_shapes BIGINT[][],
    output_dtypes VARCHAR[],
    code_file     VARCHAR,             -- innermost user frame of '# In file' lines
    code_line     INTEGER,
    code_text     VARCHAR,
    code_trace    VARCHAR[]            -- all '# In file' lines, outermost first
);

-- Kernel order from execution_order/ms_execution_order_graph_{graph_id}.csv.
CREATE TABLE execution_order (
    run        VARCHAR NOT NULL,
    rank       INTEGER,
    graph_id   INTEGER,
    position   INTEGER,                -- 0-based line in the csv
    scope_name VARCHAR
);

-- Iterations each graph ran, from ms_global_execution_order_graph_{graph_id}.csv.
CREATE TABLE graph_executions (
    run       VARCHAR NOT NULL,
    rank      INTEGER,
    graph_id  INTEGER,
    iteration BIGINT
);

CREATE TABLE ingest_errors (
    run         VARCHAR NOT NULL,
    source_file VARCHAR NOT NULL,
    error       VARCHAR NOT NULL,
    time        TIMESTAMP NOT NULL DEFAULT current_timestamp
);
