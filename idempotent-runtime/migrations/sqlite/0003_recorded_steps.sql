-- Recovery points: the steps a handler completed under an in-progress record
-- (src/store/steps.rs).
--
-- steps: the concatenation of `encode_step(step)` in recording order (binary: names,
--        times and outputs, NUL and 0xFF bytes included); NULL: none. Only an
--        in-progress record holds steps; `complete` clears them, a takeover of an
--        expired record clears them, a takeover of a lost lease keeps them.
--
-- Added in place: existing records keep every column and hold no steps.
ALTER TABLE idempotency_records ADD COLUMN steps BLOB NULL
    CHECK (steps IS NULL OR state = 'in_progress');
