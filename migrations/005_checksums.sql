-- dumpdb catalog, schema version 5: a checksum of every shard file, for 'dumpdb verify'.
-- 'crc32c:<hex>' of the file's bytes; NULL for arrays written before this version.
ALTER TABLE arrays ADD COLUMN checksum VARCHAR;
