-- Fresh keys: every request carries a key no record has, shaped like the preloaded ones
-- (36 characters): <tag>-0000-4000-9000-<counter, 12 digits>; the preloaded keys have
-- 8000 where these have 9000, and each run passes its own 8-hex-digit tag.
-- Arguments after `--`: <tag> <body file> <scope>
local counter = 0
local tag

function init(args)
  tag = args[1]
  local file = assert(io.open(args[2], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  file:close()
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[3]
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = string.format("%s-0000-4000-9000-%012d", tag, counter)
  return wrk.format()
end
