-- http-request lua.check_tensors: what an inference request's tensors declare, for
-- gateway/haproxy.cfg to compare with the model's bound (models.map) before Triton sees the
-- request; the two checks a regular expression cannot make. It sets:
--
--   txn.values    the sum, over every "shape" array of the body (of a binary request: of its JSON
--                 header, the first Inference-Header-Content-Length bytes), of the product of its
--                 numbers. Triton 2.51 allocates a declared shape before comparing it with the
--                 data sent, so a short body declaring [100000000, 128] made it abort.
--   txn.mismatch  for an input of a JSON body whose "data" holds another number of values than
--                 its shape declares, "<name>: ...": Triton 2.51 answers that with a 500 ("Unable
--                 to parse 'data'"), the gateway with a 400 naming the input.
--
-- haproxy.cfg runs it on bodies whose format it has already checked (every shape a list of
-- integers, data numbers or booleans in nested lists); a shape of anything else counts as more
-- values than any model takes. Lua 5.3 (Debian's HAProxy 2.6) and 5.4 (the official image's).

-- Past this the count is "too many" whatever the model: exact in a double, and an integer in
-- both Lua versions.
local TOO_MANY = 2 ^ 53

local function product(dims)
  local values = 1.0
  for number in dims:gmatch("[^,%s]+") do
    if not number:match("^%d+$") then
      return TOO_MANY
    end
    values = values * tonumber(number)
  end
  return math.min(values, TOO_MANY)
end

-- The first input whose data and shape disagree, described; nil when none does.
local function mismatch(body)
  local inputs = body:match('"inputs"%s*:%s*(%b[])')
  if inputs == nil then
    return nil
  end
  for tensor in inputs:gmatch("%b{}") do
    local dims = tensor:match('"shape"%s*:%s*%[([^%]]*)%]')
    local data = tensor:match('"data"%s*:%s*(%b[])')
    if dims ~= nil and data ~= nil then
      local count = 0
      for _ in data:gsub("[%[%]]", " "):gmatch("[^,%s]+") do
        count = count + 1
      end
      local declared = product(dims)
      if count ~= declared then
        local name = tensor:match('"name"%s*:%s*"([^"\\]*)"') or "an input"
        return string.format(
          "%s: shape [%s] declares %d values, data holds %d", name:sub(1, 64),
          dims:gsub("%s", ""), math.tointeger(declared) or -1, count)
      end
    end
  end
  return nil
end

core.register_action("check_tensors", { "http-req" }, function(txn)
  local body = txn.f:req_body() or ""
  local header = txn.f:req_hdr("inference-header-content-length")
  local binary = header ~= nil and header ~= ""
  if binary then
    local length = tonumber(header)
    if length == nil then
      txn:set_var("txn.values", math.tointeger(TOO_MANY))
      return
    end
    body = body:sub(1, length)
  end
  local total = 0.0
  for dims in body:gmatch('"shape"%s*:%s*%[([^%]]*)%]') do
    total = math.min(total + product(dims), TOO_MANY)
  end
  txn:set_var("txn.values", math.tointeger(total))
  if not binary then
    local wrong = mismatch(body)
    if wrong ~= nil then
      txn:set_var("txn.mismatch", wrong)
    end
  end
end)
