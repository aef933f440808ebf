-- A mix of fresh keys and retries: nine requests in ten carry a key never sent before
-- (<prefix>-1, <prefix>-2, ...), one in ten a key this run sent earlier, chosen uniformly
-- (a run lasts well under a minute, so these are retries of keys from the last minute).
-- Arguments after `--`: <key prefix> <body file>
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
  math.randomseed(os.time())
end

function request()
  -- Retries start after the first 100 keys, and skip the 64 sent last (likely in flight,
  -- which would answer 409 and measure the wait rather than the replay).
  if counter > 100 and math.random(10) == 1 then
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. math.random(2, counter - 64)
  else
    counter = counter + 1
    wrk.headers["Idempotency-Key"] = prefix .. "-" .. counter
  end
  return wrk.format()
end
