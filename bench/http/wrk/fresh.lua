-- Fresh keys: every request carries an Idempotency-Key never sent before
-- (<prefix>-1, <prefix>-2, ...). The replay run (replay.lua) sends the first keys again.
-- Arguments after `--`: <key prefix> <body file> [<Cookie header>]
local counter = 0
local prefix

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
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. counter
  return wrk.format()
end
