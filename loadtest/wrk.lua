-- wrk script: cycle through the request paths in a file (one per line,
-- presigned query included), one GET each; print one JSON line at the end.
--   wrk -s wrk.lua URL -- PATHS_FILE
local paths = {}
local index = 0

function init(args)
  local handle = assert(io.open(args[1], "r"))
  for line in handle:lines() do
    if #line > 0 then paths[#paths + 1] = line end
  end
  handle:close()
  -- Threads start at different places in the list.
  index = math.random(#paths) - 1
end

function request()
  index = index % #paths + 1
  return wrk.format("GET", paths[index])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "bytes": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
