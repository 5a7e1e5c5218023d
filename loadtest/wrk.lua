-- wrk script: cycle through the requests in a file, one GET each; print one JSON
-- line at the end.   wrk -s wrk.lua URL -- REQUESTS_FILE
-- Each line is a path (presigned query included), optionally followed by
-- tab-separated "Name: value" headers (a header-signed SigV4 request carries its
-- Authorization, X-Amz-Date and X-Amz-Content-Sha256 there). Every request is
-- formatted once, in init, so the generator spends nothing per request on it.
local requests = {}
local index = 0

local function parse(line)
  local fields = {}
  for field in line:gmatch("[^\t]+") do fields[#fields + 1] = field end
  local headers = {}
  for i = 2, #fields do
    local name, value = fields[i]:match("^([^:]+):%s*(.*)$")
    headers[name] = value
  end
  return wrk.format("GET", fields[1], headers)
end

function init(args)
  local handle = assert(io.open(args[1], "r"))
  for line in handle:lines() do
    if #line > 0 then requests[#requests + 1] = parse(line) end
  end
  handle:close()
  -- Threads start at different places in the list.
  index = math.random(#requests) - 1
end

function request()
  index = index % #requests + 1
  return requests[index]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "bytes": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
