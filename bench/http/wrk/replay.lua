-- Replays: cycles through keys the fresh run (fresh.lua, same prefix) completed,
-- <prefix>-2 .. <prefix>-<count + 1>, with the same body, so every request is a replay.
-- Not <prefix>-1: wrk calls request() once before the run to inspect the request, so
-- the fresh run never sent its first key.
-- Arguments after `--`: <key prefix> <body file> <Cookie header or ""> <count>
local counter = 0
local prefix, count

function init(args)
  prefix = args[1]
  local file = assert(io.open(args[2], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  file:close()
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer bench"
  if args[3] ~= nil and args[3] ~= "" then
    wrk.headers["Cookie"] = args[3]
  end
  count = tonumber(args[4])
end

function request()
  counter = counter % count + 1
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. (counter + 1)
  return wrk.format()
end
