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
--                 before Triton runs a shape the model was never meant to take. Likewise when
--                 dims the model's inputs share (the 7th field: an attention mask's length and
--                 its token ids') differ in the request.
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

-- "<name>: ..." when a shape (a list of integers) exceeds the bounds of that input (nil: the
-- input is not bounded); nil when it is within them.
local function over_bounds(name, shape, bounds)
  local largest = bounds[hex(name)]
  if largest == nil then
    return nil
  end
  local over = #shape ~= #largest
  for i = 1, math.min(#shape, #largest) do
    over = over or shape[i] < 0 or shape[i] > largest[i]
  end
  if over then
    return string.format("%s: shape [%s] is beyond the largest the model takes, [%s]",
      name:sub(1, 64), table.concat(shape, ","), table.concat(largest, ","))
  end
  return nil
end

-- The dims a request's inputs must agree in, from the map entry's 7th field (`;`-separated
-- groups of `,`-separated `<name in hex>.<axis>`): { { { name, axis }, ... }, ... }.
local function parse_shared(field)
  local groups = {}
  for group in (field or ""):gmatch("[^;]+") do
    local members = {}
    for name, axis in group:gmatch("(%x+)%.(%d+)") do
      members[#members + 1] = { name, tonumber(axis) }
    end
    groups[#groups + 1] = members
  end
  return groups
end

-- "<name>: ..." for the first dim the inputs sent (hex name -> { name, shape }) size apart where
-- the model's graph names them alike (an attention mask as long as its token ids): Triton would
-- run it and the model fail inside, a 500. nil when they agree.
local function disagreement(sent, groups)
  for _, group in ipairs(groups) do
    local first = nil
    for _, member in ipairs(group) do
      local tensor = sent[member[1]]
      local size = tensor and tensor.shape[member[2]]
      if size ~= nil and first == nil then
        first = { tensor.name, member[2], size }
      elseif size ~= nil and size ~= first[3] then
        return string.format("%s: dim %d is %d where %s's dim %d is %d; the model takes them equal",
          tensor.name:sub(1, 64), member[2] - 1, size, first[1]:sub(1, 64), first[2] - 1, first[3])
      end
    end
  end
  return nil
end

-- The first input whose shape exceeds its bounds, or first dims that must agree and do not,
-- described; nil when none.
local function beyond(body, bounds, groups)
  local inputs = body:match('"inputs"%s*:%s*(%b[])')
  if inputs == nil then
    return nil
  end
  local sent = {}
  for tensor in inputs:gmatch("%b{}") do
    local name = tensor:match('"name"%s*:%s*"([^"\\]*)"')
    local dims = tensor:match('"shape"%s*:%s*%[([^%]]*)%]')
    if name ~= nil and dims ~= nil then
      local shape = {}
      for number in dims:gmatch("%d+") do
        shape[#shape + 1] = tonumber(number)
      end
      local found = over_bounds(name, shape, bounds)
      if found ~= nil then
        return found
      end
      if #groups > 0 then
        sent[hex(name)] = { name = name, shape = shape }
      end
    end
  end
  return disagreement(sent, groups)
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
    local shared = limits:match("^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:([^:]*)")
    local found = beyond(body, parse_bounds(bounds_field), parse_shared(shared))
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
-- itself, read from what has arrived of it (haproxy.cfg waits for its first kilobytes, or all of
-- it: a metadata call is small). It sets:
--
--   txn.grpc_length  the message's length, from gRPC's 5-byte prefix (a compression flag, then
--                    the length, big-endian), for haproxy.cfg to compare with the model's cap.
--   txn.grpc_compressed  set when the flag says compressed: the gateway cannot read such a
--                    message, and its length says nothing of what Triton would inflate.
--   txn.model        model_name (field 1 of ModelInferRequest, name of the metadata requests);
--                    txn.model_message: the same, written for a grpc-message header.
--   txn.model_twice  set when field 1 comes again with another name: protobuf takes the last,
--                    Triton would serve that one, and the gateway checked the first.
--   txn.sequence     "<model> <ID>" of the "sequence_id" entry of parameters (field 4: map<string,
--                    InferParameter>), as lua.check_tensors sets it.
--   txn.beyond       (lua.grpc_bounds) as lua.check_tensors', for a grpc-message header: an
--                    input (field 5: InferInputTensor, its name field 1 and shape field 3) whose
--                    shape exceeds its model's bounds, or dims it shares with another
--                    input that differ (models.map).
--
-- Protobuf writes fields in their numbers' order, so model, parameters and the inputs' names and
-- shapes come before the tensors' bytes (raw_input_contents, field 7, or an input's contents,
-- its field 5): a message larger than what arrived is checked on that start.
local function varint(data, at, stop)
  local value, shift = 0, 0
  while at <= stop and shift < 64 do
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

-- The fields of the message in data[at..stop], in order, each { field, wire type, value } where
-- a varint's value is its number and a length-delimited field's is { first, last }, its bytes'
-- positions (not copied: a tensor's bytes may be megabytes). The second result is false when the
-- data ends inside a field: the rest of the message has not arrived, or it is not protobuf.
local function fields(data, at, stop)
  local found = {}
  while at <= stop do
    local tag, value
    tag, at = varint(data, at, stop)
    if tag == nil then
      return found, false
    end
    local wire = tag & 7
    if wire == 0 then
      value, at = varint(data, at, stop)
    elseif wire == 2 then
      local length
      length, at = varint(data, at, stop)
      if length ~= nil and length >= 0 and at + length - 1 <= stop then
        value, at = { at, at + length - 1 }, at + length
      else
        -- cut: what arrived of it, for the message's own fields read so far
        found[#found + 1] = { tag >> 3, wire, { at, stop }, cut = true }
        return found, false
      end
    elseif wire == 1 or wire == 5 then
      at = at + (wire == 1 and 8 or 4)
      value = at - 1 <= stop and 0 or nil
    end
    if value == nil then
      return found, false
    end
    found[#found + 1] = { tag >> 3, wire, value }
  end
  return found, true
end

local function text(data, span)
  return data:sub(span[1], span[2])
end

-- A text as gRPC's grpc-message carries it: bytes outside printable ASCII, and "%", as %XX.
local function grpc_message(value)
  return (value:gsub("[^ -$&-~]", function(char) return string.format("%%%02X", char:byte()) end))
end

-- One InferInputTensor's name and shape (packed, as protobuf writes a repeated int64, or not);
-- nil for either that has not arrived.
local function input_shape(data, span)
  local name, shape = nil, nil
  for _, entry in ipairs((fields(data, span[1], span[2]))) do
    local field, wire, value = entry[1], entry[2], entry[3]
    if field == 1 and wire == 2 and not entry.cut then
      name = text(data, value)
    elseif field == 3 and wire == 2 and not entry.cut then
      shape = shape or {}
      local at = value[1]
      while at <= value[2] do
        local dim
        dim, at = varint(data, at, value[2])
        if dim == nil then
          break
        end
        shape[#shape + 1] = dim
      end
    elseif field == 3 and wire == 0 then
      shape = shape or {}
      shape[#shape + 1] = value
    end
  end
  return name, shape
end

-- The sequence ID of one entry of parameters, when its key is "sequence_id".
local function sequence_id(data, span)
  local key, parameter = nil, nil
  for _, part in ipairs((fields(data, span[1], span[2]))) do
    if part[1] == 1 and part[2] == 2 and not part.cut then
      key = text(data, part[3])
    elseif part[1] == 2 and part[2] == 2 and not part.cut then
      parameter = part[3]
    end
  end
  if key ~= "sequence_id" or parameter == nil then
    return nil
  end
  local sequence = nil
  for _, value in ipairs((fields(data, parameter[1], parameter[2]))) do
    if (value[1] == 2 or value[1] == 5) and value[2] == 0 then -- int64_param, uint64_param
      sequence = string.format("%d", value[3])
    elseif value[1] == 3 and value[2] == 2 and not value.cut then -- string_param
      sequence = text(data, value[3]):sub(1, 64)
    end
  end
  return sequence
end

core.register_action("grpc_request", { "http-req" }, function(txn)
  local body = txn.f:req_body() or ""
  if #body < 5 then
    return
  end
  local length = string.unpack(">I4", body, 2)
  txn:set_var("txn.grpc_length", length)
  if body:byte(1) ~= 0 then
    txn:set_var("txn.grpc_compressed", 1)
    return
  end
  local message = fields(body, 6, math.min(#body, 5 + length))
  local model, sequence, inputs = nil, nil, {}
  for _, entry in ipairs(message) do
    local field, wire, value = entry[1], entry[2], entry[3]
    if field == 1 and wire == 2 then
      local name = entry.cut and "" or text(body, value)
      if model == nil then
        model = name
      elseif name ~= model then
        txn:set_var("txn.model_twice", 1)
      end
    elseif field == 4 and wire == 2 and not entry.cut then
      sequence = sequence_id(body, value) or sequence
    elseif field == 5 and wire == 2 then
      inputs[#inputs + 1] = value
    end
  end
  if model == nil then
    return
  end
  txn:set_var("txn.model", model)
  txn:set_var("txn.model_message", grpc_message(model:sub(1, 128)))
  if sequence ~= nil then
    txn:set_var("txn.sequence", model:sub(1, 128) .. " " .. sequence)
  end
  txn:set_priv({ body = body, inputs = inputs })
end)

-- http-request lua.grpc_bounds, after lua.grpc_request and the model's map lookup (txn.limits):
-- txn.beyond for the first input of that message whose shape exceeds the model's bounds.
core.register_action("grpc_bounds", { "http-req" }, function(txn)
  local read = txn:get_priv()
  local limits = txn:get_var("txn.limits") or ""
  local bounds_field = limits:match("^[^:]*:[^:]*:[^:]*:([^:]*)")
  if read == nil or bounds_field == nil or bounds_field == "" then
    return
  end
  local bounds = parse_bounds(bounds_field)
  local groups = parse_shared(limits:match("^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:([^:]*)"))
  local sent = {}
  for _, span in ipairs(read.inputs) do
    local name, shape = input_shape(read.body, span)
    if name ~= nil and shape ~= nil then
      local found = over_bounds(name, shape, bounds)
      if found ~= nil then
        txn:set_var("txn.beyond", grpc_message(found))
        return
      end
      sent[hex(name)] = { name = name, shape = shape }
    end
  end
  local found = disagreement(sent, groups)
  if found ~= nil then
    txn:set_var("txn.beyond", grpc_message(found))
  end
end)
