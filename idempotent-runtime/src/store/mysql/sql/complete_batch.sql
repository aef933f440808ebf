-- A batch of completions in one request (group_commit.rs): one Complete compare-and-set
-- (update.sql) per completion (its placeholder below, each statement ending in `;`),
-- every value a literal, in one transaction, so the batch costs one commit. Each
-- UPDATE's count of matched rows says whether its record was still at its version.
START TRANSACTION;
{completions}
COMMIT
