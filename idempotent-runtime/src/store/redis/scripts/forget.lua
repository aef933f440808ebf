-- forget. KEYS[1] the record. ARGV: [1] clock offset ms, [2] '1' to force.
-- Returns {'not_found'} (no live record; an expired one is deleted all the same)
--       | {'refused', lease ms left} (in progress, lease held, not forced; nothing changed)
--       | {'forgotten', describe(...)...} (deleted; what it was).
local key = KEYS[1]
local now = now_ms()
local record, err = load(key)
if err then
  return redis.error_reply(err)
end
if not record then
  return { 'not_found' }
end
if not is_live(record, now) then
  redis.call('DEL', key)
  return { 'not_found' }
end
if record.state == 'in_progress' and record.lease_expires_at > now and ARGV[2] ~= '1' then
  return { 'refused', record.lease_expires_at - now }
end
local described = describe(key, record, now)
redis.call('DEL', key)
table.insert(described, 1, 'forgotten')
return described
