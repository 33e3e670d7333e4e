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
--   txn.sequence  "<model> <sequence ID>" of a request that names its sequence (a model keeping
--                 state in the server: tritonstack add-model --server-state): the backend sticks
--                 the sequence to one replica, where Triton keeps its state.
--
--   txn.beyond    for an input whose model bounds its variable dims (the 4th field of the
--                 model's models.map entry: `<name in hex>=<AxB...>` per input, `;`-separated),
--                 "<name>: ..." when its shape exceeds them in some dim: the gateway answers 400
--                 before Triton runs a shape the model was never meant to take.
--
-- haproxy.cfg runs it on bodies whose format it has already checked (every shape a list of
-- integers, data numbers, booleans or strings in nested lists); a shape of anything else counts
-- as more values than any model takes. A model with string inputs (the map entry's 5th field is
-- "s") has its string values blanked first, so that a comma or a bracket inside one is not read
-- as structure. Lua 5.3 (Debian's HAProxy 2.6) and 5.4 (the official image's).

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

-- The body with every JSON string literal of more than a plain name blanked to "_": a string
-- value may hold commas, brackets and escaped quotes, which the searches below would read as
-- structure. Names (plain ASCII) are kept, since the messages name the input.
local function blank_strings(body)
  local parts, at = {}, 1
  while true do
    local open = body:find('"', at, true)
    if open == nil then
      break
    end
    local close = open + 1
    while true do
      close = body:find('["\\]', close)
      if close == nil or body:sub(close, close) == '"' then
        break
      end
      close = close + 2 -- a backslash and the character it escapes
    end
    if close == nil then
      break -- unterminated: the format check has refused such a body already
    end
    local literal = body:sub(open, close)
    parts[#parts + 1] = body:sub(at, open - 1)
    parts[#parts + 1] = literal:match('^"[%w_.%-]*"$') and literal or '"_"'
    at = close + 1
  end
  parts[#parts + 1] = body:sub(at)
  return table.concat(parts)
end

-- The largest shape of each bounded input, from the map entry's field: name (hex) -> dims.
local function parse_bounds(field)
  local bounds = {}
  for entry in field:gmatch("[^;]+") do
    local name, dims = entry:match("^(%x+)=([%dx]+)$")
    if name ~= nil then
      local list = {}
      for dim in dims:gmatch("%d+") do
        list[#list + 1] = tonumber(dim)
      end
      bounds[name] = list
    end
  end
  return bounds
end

local function hex(text)
  return (text:gsub(".", function(char) return string.format("%02X", char:byte()) end))
end

-- The first input whose shape exceeds its bounds, described; nil when none does.
local function beyond(body, bounds)
  local inputs = body:match('"inputs"%s*:%s*(%b[])')
  if inputs == nil then
    return nil
  end
  for tensor in inputs:gmatch("%b{}") do
    local name = tensor:match('"name"%s*:%s*"([^"\\]*)"')
    local dims = tensor:match('"shape"%s*:%s*%[([^%]]*)%]')
    local largest = name and bounds[hex(name)]
    if largest ~= nil and dims ~= nil then
      local shape = {}
      for number in dims:gmatch("%d+") do
        shape[#shape + 1] = tonumber(number)
      end
      local over = #shape ~= #largest
      for i = 1, math.min(#shape, #largest) do
        over = over or shape[i] > largest[i]
      end
      if over then
        return string.format("%s: shape [%s] is beyond the largest the model takes, [%s]",
          name:sub(1, 64), dims:gsub("%s", ""), table.concat(largest, ","))
      end
    end
  end
  return nil
end

core.register_action("check_tensors", { "http-req" }, function(txn)
  local body = txn.f:req_body() or ""
  local limits = txn:get_var("txn.limits") or ""
  local bounds_field, kinds = limits:match("^[^:]*:[^:]*:[^:]*:([^:]*):?([^:]*)")
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
  local sequence = body:match('"sequence_id"%s*:%s*"?([^",}%s]+)')
  if sequence ~= nil then
    txn:set_var("txn.sequence", (txn:get_var("txn.model") or "") .. " " .. sequence:sub(1, 64))
  end
  if kinds == "s" then
    body = blank_strings(body)
  end
  if bounds_field ~= nil and bounds_field ~= "" then
    local found = beyond(body, parse_bounds(bounds_field))
    if found ~= nil then
      txn:set_var("txn.beyond", found)
    end
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

-- http-request lua.grpc_request: what a gRPC request (ModelInfer, or a metadata call) says of
-- itself before the rest of it arrives.
-- gRPC's 5-byte prefix: a compression flag, then the message's length (big-endian), set as
-- txn.grpc_length for haproxy.cfg to compare with the model's cap. Then the start of the
-- protobuf: model_name (field 1, set as txn.model) and the "sequence_id" entry of parameters
-- (field 4: map<string, InferParameter>; the same txn.sequence as lua.check_tensors sets), which
-- come before the tensors (fields 5 on) in the order protobuf writes fields. Only what has
-- arrived is read.
local function varint(data, at)
  local value, shift = 0, 0
  while at <= #data and shift < 64 do
    local byte = data:byte(at)
    value = value | ((byte & 0x7F) << shift)
    at = at + 1
    if byte < 0x80 then
      return value, at
    end
    shift = shift + 7
  end
  return nil, at
end

-- The fields of one message, each as (field number, wire type, value: a number or the bytes of a
-- length-delimited field); stops at the first field numbered `last` or beyond, or what is cut.
local function fields(data, at, last)
  local found = {}
  while at <= #data do
    local tag
    tag, at = varint(data, at)
    if tag == nil or (tag >> 3) >= last then
      break
    end
    local field, wire, value = tag >> 3, tag & 7, nil
    if wire == 0 then
      value, at = varint(data, at)
    elseif wire == 2 then
      local length
      length, at = varint(data, at)
      if length == nil or at + length - 1 > #data then
        break
      end
      value, at = data:sub(at, at + length - 1), at + length
    elseif wire == 1 or wire == 5 then
      at = at + (wire == 1 and 8 or 4)
    else
      break
    end
    if value == nil then
      break
    end
    found[#found + 1] = { field, wire, value }
  end
  return found
end

core.register_action("grpc_request", { "http-req" }, function(txn)
  local body = txn.f:req_body() or ""
  if #body >= 5 then
    txn:set_var("txn.grpc_length", (string.unpack(">I4", body, 2)))
  end
  local model, sequence = nil, nil
  for _, entry in ipairs(fields(body, 6, 5)) do
    if entry[1] == 1 and entry[2] == 2 then
      model = entry[3]
    elseif entry[1] == 4 and entry[2] == 2 then
      local key, parameter = nil, nil
      for _, part in ipairs(fields(entry[3], 1, 3)) do
        if part[1] == 1 then key = part[3] elseif part[1] == 2 then parameter = part[3] end
      end
      if key == "sequence_id" and type(parameter) == "string" then
        for _, value in ipairs(fields(parameter, 1, 6)) do
          if value[1] == 2 or value[1] == 5 then -- int64_param, uint64_param
            sequence = string.format("%d", value[3])
          elseif value[1] == 3 then -- string_param
            sequence = value[3]:sub(1, 64)
          end
        end
      end
    end
  end
  if model ~= nil then
    txn:set_var("txn.model", model:sub(1, 128))
    if sequence ~= nil then
      txn:set_var("txn.sequence", model:sub(1, 128) .. " " .. sequence)
    end
  end
end)
