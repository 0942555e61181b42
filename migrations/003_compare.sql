-- dumpdb catalog, schema version 3: run-to-run comparison results.
-- See README "Comparing runs" and dumpdb/compare/.

CREATE SEQUENCE compare_id_seq START 1;

-- One row per comparison made (dumpdb compare / Archive.compare).
CREATE TABLE compares (
    compare_id       BIGINT PRIMARY KEY,
    target_run       VARCHAR NOT NULL,
    bench_run        VARCHAR NOT NULL,
    target_selection VARCHAR,          -- e.g. 'iteration=0 rank=0' (NULL: whole run)
    bench_selection  VARCHAR,
    mode             VARCHAR NOT NULL, -- 'tensor' (payloads) | 'statistics' (either side has none)
    options          JSON,             -- thresholds, strategies, mapping file
    pairs            BIGINT,
    unmatched_target BIGINT,
    unmatched_bench  BIGINT,
    created_at       TIMESTAMP NOT NULL DEFAULT current_timestamp,
    dumpdb_version   VARCHAR
);

-- One row per aligned tensor pair. Metric definitions: reference formats.md 2.1 (msprobe)
-- and 2.2 (msaccucmp); NULL where a metric does not apply (see err_message).
CREATE TABLE compare_results (
    compare_id                 BIGINT NOT NULL,
    pair_index                 BIGINT NOT NULL,   -- target order: iteration, execution order, io, slot
    target_tensor_id           BIGINT,
    bench_tensor_id            BIGINT,
    target_name                VARCHAR,           -- op name as dumped (msprobe: NPU Name)
    bench_name                 VARCHAR,           -- (msprobe: Bench Name)
    io                         VARCHAR,
    slot                       INTEGER,
    match_strategy             VARCHAR,           -- exact | normalized | order | mapping
    mode                       VARCHAR,           -- tensor | statistics
    cosine                     DOUBLE,
    euc_dist                   DOUBLE,
    max_abs_err                DOUBLE,
    max_rel_err                DOUBLE,
    one_thousandth_err_ratio   DOUBLE,
    five_thousandths_err_ratio DOUBLE,
    mean_abs_err               DOUBLE,
    rmse                       DOUBLE,
    rel_euc_dist               DOUBLE,
    accumulated_rel_err        DOUBLE,
    mean_rel_err               DOUBLE,
    kl_divergence              DOUBLE,
    max_diff                   DOUBLE,            -- statistics: target - bench
    min_diff                   DOUBLE,
    mean_diff                  DOUBLE,
    l2norm_diff                DOUBLE,
    max_rel_diff               DOUBLE,            -- |diff / bench| (NULL when bench is 0)
    min_rel_diff               DOUBLE,
    mean_rel_diff              DOUBLE,
    l2norm_rel_diff            DOUBLE,
    result                     VARCHAR,           -- pass | warning | error (msprobe rules)
    err_message                VARCHAR
);

-- Tensors of either side that found no partner: listed, never dropped silently.
CREATE TABLE compare_unmatched (
    compare_id BIGINT NOT NULL,
    side       VARCHAR NOT NULL,                  -- 'target' | 'bench'
    tensor_id  BIGINT,
    name       VARCHAR,
    io         VARCHAR,
    slot       INTEGER
);
