-- Leases judged on the host's monotonic clock, which a wall-clock step cannot move
-- (see src/store/sqlite/lease_time.rs).
--
-- lease_boot_id:      the boot (16 bytes, the kernel's boot id on Linux) whose
--                     monotonic clock the lease was written on; NULL: written on the
--                     wall clock (a clock with no boot, or before this migration), and
--                     judged on lease_expires_at. A lease of another boot has run out.
-- lease_ends_boot_ms: the lease's end on that boot's clock, in milliseconds.
--
-- lease_expires_at stays: the lease's end on the wall clock, written with every lease.
ALTER TABLE idempotency_records ADD COLUMN lease_boot_id BLOB NULL;
ALTER TABLE idempotency_records ADD COLUMN lease_ends_boot_ms INTEGER NULL;
