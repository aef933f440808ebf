-- A batch of completions in one request (group_commit.rs): one complete.sql per
-- completion (its placeholder below, each statement ending in `;`), every value a
-- literal, in one transaction, so the batch costs one commit. Each UPDATE's count of
-- matched rows says whether its token still owned the claim.
START TRANSACTION;
{completions}
COMMIT
