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

-- How many values a "data" array holds, nested lists flattened.
local function count_values(data)
  local _, count = data:gsub("[^,%[%]%s]+", "")
  return count
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
      local count = count_values(data)
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

-- Each "shape" array's number of values and each "data" array's, in the order they appear.
-- Plain searches find the keys (a pattern tried at every position of the body would cost more
-- than the rest of the gateway's work per request).
local function declared_and_sent(body)
  local declared, sent = {}, {}
  local at = 1
  while true do
    local _, stop = body:find('"shape"', at, true)
    if stop == nil then
      break
    end
    local dims = body:match("^%s*:%s*%[([^%]]*)%]", stop + 1)
    if dims ~= nil then -- else a string "shape" (a name) or a parameter's key
      declared[#declared + 1] = product(dims)
    end
    at = stop + 1
  end
  at = 1
  while true do
    local _, stop = body:find('"data"', at, true)
    if stop == nil then
      break
    end
    local first, last = body:match("^%s*:%s*()%b[]()", stop + 1)
    if first ~= nil then
      -- In nested lists of values every comma separates two elements of one list, so a data
      -- array holds one value more than it has commas (an empty list aside, which the exact
      -- count below settles when the two disagree).
      local _, commas = body:sub(first, last - 1):gsub(",", "")
      sent[#sent + 1] = commas + 1
      at = last
    else
      at = stop + 1
    end
  end
  return declared, sent
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
  local declared, sent = declared_and_sent(body)
  local total = 0.0
  for _, values in ipairs(declared) do
    total = math.min(total + values, TOO_MANY)
  end
  txn:set_var("txn.values", math.tointeger(total))
  if binary then
    return
  end
  -- The i-th shape and the i-th data array are one input's when every input has both; only a
  -- disagreement (or inputs without data) costs the walk that names the input.
  local agree = #declared == #sent
  for i = 1, #sent do
    agree = agree and declared[i] == sent[i]
  end
  if not agree then
    local wrong = mismatch(body)
    if wrong ~= nil then
      txn:set_var("txn.mismatch", wrong)
    end
  end
end)
