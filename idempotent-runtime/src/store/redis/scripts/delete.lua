-- delete. KEYS[1] the record. ARGV: [1] version. Returns 1 when the record was at that
-- version and is deleted, else 0.
local record = dump(KEYS[1])
if record and record[12] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
