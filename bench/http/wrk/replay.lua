-- Replays: cycles through keys the fresh run (fresh.lua, same prefix) completed,
-- <prefix>-1 .. <prefix>-<count>, with the same body, so every request is a replay.
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
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. counter
  return wrk.format()
end
