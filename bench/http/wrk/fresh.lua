-- Fresh keys: every request carries an Idempotency-Key never sent before
-- (<prefix>-1, <prefix>-2, ...). The replay run (replay.lua) sends the first keys again.
-- With a retry percentage (mix.sh: 10), that share of requests instead retries a key
-- this run sent earlier, chosen uniformly: a run lasts well under a minute, so these are
-- retries of keys from the last minute.
-- Arguments after `--`: <key prefix> <body file> [<Cookie header> [<retry percentage>]]
local counter = 0
local prefix
local retry_percent = 0

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
  if args[4] ~= nil then
    retry_percent = tonumber(args[4])
    math.randomseed(os.time())
  end
end

function request()
  -- Retries start after the first 100 keys, and skip the 64 sent last (likely still in
  -- flight: a 409 would measure the wait rather than the replay).
  if retry_percent > 0 and counter > 100 and math.random(100) <= retry_percent then
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. math.random(2, counter - 64)
  else
    counter = counter + 1
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. counter
  end
  return wrk.format()
end
