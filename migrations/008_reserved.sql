-- Placeholder on branch truth-a only: migration 008 belongs to another branch.
-- Migration numbers must run without gaps (dumpdb.catalog.migrations), so this file
-- holds the place of 008 for 009 to load. DELETE THIS FILE AT MERGE (the real 008 replaces it).
SELECT 1;
