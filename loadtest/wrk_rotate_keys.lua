-- wrk script: GET /v1/tables/{table}/keys/{prefix}{i}, rotating i over the keyspace, and a
-- JSON summary line at the end (parsed by loadtest.loadclients). Paths are built once per
-- thread so that the request function stays cheap: wrk must not eat the cores it measures.
--   WRK_TABLE=sensor_stats WRK_KEY_PREFIX=sensor- WRK_KEYS=100 WRK_QUERY='max_lag=100'
--   WRK_SUFFIX=/windows: a route below each key (then the query carries from and to)
--   WRK_KEY_STRIDE=500: key k is {prefix}{k * stride}, so that WRK_KEYS keys spread over a table 500 times larger
local table_name = os.getenv("WRK_TABLE") or "sensor_stats"
local prefix = os.getenv("WRK_KEY_PREFIX") or "sensor-"
local suffix = os.getenv("WRK_SUFFIX") or ""
local n = tonumber(os.getenv("WRK_KEYS") or "100")
local query = os.getenv("WRK_QUERY") or ""
local stride = tonumber(os.getenv("WRK_KEY_STRIDE") or "1")
local requests_ = {}
local i = 0

init = function(args)
  for k = 0, n - 1 do
    local path = "/v1/tables/" .. table_name .. "/keys/" .. prefix .. (k * stride) .. suffix
    if query ~= "" then path = path .. "?" .. query end
    requests_[k + 1] = wrk.format("GET", path)
  end
  -- Each thread starts at a different place in the keyspace.
  i = math.random(0, n - 1)
end

request = function()
  i = i % n + 1
  return requests_[i]
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
