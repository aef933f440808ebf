-- Replays: each request carries one of the <count> preloaded keys, drawn uniformly at
-- random, with the body the preloaded records were completed with, so every request is
-- a replay. The key of i is the one src/records.rs defines:
-- <(i * 2654435) mod 2^32 in 8 hex digits>-0000-4000-8000-<i in 12 digits>.
-- Arguments after `--`: <count> <body file> <scope> <seed>
local count

function init(args)
  count = tonumber(args[1])
  local file = assert(io.open(args[2], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  file:close()
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[3]
  math.randomseed(tonumber(args[4]))
end

function request()
  local i = math.random(0, count - 1)
  wrk.headers["Idempotency-Key"] =
    string.format("%08x-0000-4000-8000-%012d", (i * 2654435) % 4294967296, i)
  return wrk.format()
end
