-- Schema v3: rows in the order they were claimed. InnoDB stores a table's rows in the
-- B-tree of its primary key. Keyed by scope_key_sha256 (v1), every new record landed on
-- a random page of that tree, so each claim dirtied a page of its own and pages split
-- half full: past the buffer pool, claims and replays waited for disk. Keyed by an
-- AUTO_INCREMENT id, new records fill the tree's last page and a day's records lie
-- together; scope_key_sha256 stays unique in a secondary index, and every statement
-- still finds a record by it (the id is never an input, only what the sweeper deletes
-- by).
--
-- Upgrades a v1/v2 table in place: one ALTER that rebuilds the table, numbering the
-- existing rows. A large table is copied while it runs (MySQL and MariaDB block writes
-- to it for an ALTER that adds an AUTO_INCREMENT column), so upgrade a big table in a
-- quiet hour; see the CHANGELOG.
--
-- One statement, like v1 and v2 (MySQL commits DDL implicitly); the migrator records v3
-- in _idempotent_migrations under the store's named lock, so it runs once per database.
ALTER TABLE idempotency_records
    DROP PRIMARY KEY,
    ADD COLUMN id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT FIRST,
    ADD PRIMARY KEY (id),
    ADD CONSTRAINT idempotency_records_scope_key_sha256_key UNIQUE (scope_key_sha256)
