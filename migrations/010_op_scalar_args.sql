-- dumpdb catalog, schema version 10 (issue 26): the constant scalar arguments of an IR node,
-- e.g. LayerNorm's epsilon: `PrimFunc_LayerNorm(%53, %54, %55, I64(-1), I64(-1), F32(1e-05))`
-- -> {"input.3": -1, "input.4": -1, "input.5": 1e-05} (dumpdb/layouts/mindspore_ir.py). compare
-- reports a difference between two paired ops' constants in its arg_diff column.
ALTER TABLE ops ADD COLUMN scalar_args JSON;  -- {"input.N": value} of the node's constant scalar arguments

COMMENT ON COLUMN ops.scalar_args IS 'The node''s constant scalar arguments by position, {"input.N": value} (IR I64(-1), F32(1e-05), Bool(1)); NULL when it has none';
