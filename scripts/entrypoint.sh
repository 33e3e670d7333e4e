#!/usr/bin/env bash
# Container entrypoint for Triton (Dockerfile.triton): pick GPU or CPU, prepare a servable view of
# the read-only model repository, build TensorRT plans on GPU hosts, then `exec tritonserver`.
#
# GPU (a GPU answers `nvidia-smi`, or TRITONSTACK_DEVICE=gpu); the image's release supports
# compute capability 7.5 and later, and a GPU it cannot use stops the container (never a silent
# fall back to CPU):
#   - every model `<name>_trt` with platform "tensorrt_plan" and no committed plan gets one, built
#     with trtexec from `<name>/1/model.onnx` (min 1 / opt TRT_OPT_BATCH / max max_batch_size rows;
#     precision: see TRT_PRECISION below) and cached in $TRITONSTACK_CACHE under a key made of the
#     GPU name, compute capability, TensorRT version, ONNX file hash and build options: an unchanged
#     key reuses the plan, a changed key (new GPU, new image, new model) builds a new one;
#   - tritonserver gets --model-config-name=gpu (configs/gpu.pbtxt where a model has one) and
#     --allow-gpu-metrics=true; ONNX Runtime's TensorRT engine cache is keyed the same way, ONNX
#     files' hashes included (ONNX Runtime's own cache id hashes names and versions, not weights).
#   Replicas share the cache (compose `--scale triton=N` mounts one volume in each): a plan is
#   built by one replica under a lock while the others wait and then reuse it, a plan whose
#   checksum no longer matches is rebuilt, and the ONNX Runtime engine directory is held by one
#   replica until its models are ready (its engines are written), so no engine is read half-written.
# CPU (no GPU, or TRITONSTACK_DEVICE=cpu): models that need a GPU (TensorRT plans, KIND_GPU
#   instances) are left out of the view, as `tritonstack serve` does; `classify` then routes to
#   `classifier`. --model-control-mode=none stays on: no load API is needed to skip them.
#
# The shared flags come from tritonserver.flags (scripts/tritonserver.flags in the repository);
# arguments given to this script (compose `command:`) are appended to tritonserver's.
# Tested outside a container with fake nvidia-smi, trtexec and tritonserver (tests/fakes/).
set -euo pipefail
# A failed step inside $(...) (plan=$(tensorrt_plan ...)) must stop the script too.
shopt -s inherit_errexit

HOME_DIR=${TRITONSTACK_HOME:-/opt/tritonstack}
REPOSITORY=${MODEL_REPOSITORY:-$HOME_DIR/model_repository}
FLAGS_FILE=${TRITONSTACK_FLAGS:-$HOME_DIR/tritonserver.flags}
CACHE=${TRITONSTACK_CACHE:-/var/cache/tritonstack}
VIEW=${TRITONSTACK_VIEW:-${TMPDIR:-/tmp}/tritonstack-repository}
DEVICE=${TRITONSTACK_DEVICE:-auto}
OPT_BATCH=${TRT_OPT_BATCH:-16}
# auto: FP16 where trtexec still takes --fp16 (TensorRT 10; every GPU the release supports has
# fast FP16); TensorRT 11 removed the precision flags (networks are strongly typed), so there the
# plan keeps the ONNX model's own precision. fp16 insists (and stops where it cannot be had); fp32.
PRECISION=${TRT_PRECISION:-auto}
# How long a replica waits for another one's plan build or engine cache before giving up.
CACHE_LOCK_TIMEOUT=${TRITONSTACK_CACHE_LOCK_TIMEOUT:-900}
# ONNX Runtime's TensorRT engine cache as configs/gpu.pbtxt names it: a link in this container
# (never on the shared volume, where replicas would repoint it under each other) to a keyed
# directory of the cache.
ORT_CACHE_LINK=${TRITONSTACK_ORT_CACHE_LINK:-/tmp/tritonstack-onnxruntime-trt}
# The image's release (26.08) supports compute capability 7.5 (Turing) and later.
MIN_COMPUTE_CAPABILITY=7.5
# Its CUDA 13.4.1 ships with driver 615.61 (the server's compatibility.md on r26.08); CUDA 13.x
# runs on R580 and later in minor-version compatibility mode, with fewer features (no JIT of PTX
# newer than the driver); older drivers only through the image's forward-compatibility package,
# on data-center GPUs. NVIDIA's CUDA compatibility guide.
RECOMMENDED_DRIVER=615
MIN_DRIVER=580
# Shorter than compose's stop_grace_period (30s), so Triton drains in-flight requests and exits
# before Docker's SIGKILL.
EXIT_TIMEOUT=${TRITON_EXIT_TIMEOUT_SECS:-20}
# Ports, the admin header and the API groups it guards: tritonstack/contract.py's values, written
# out because the image has no tritonstack package (tests/unit/test_contract.py holds them equal).
HTTP_PORT=${TRITON_HTTP_PORT:-8000}
GRPC_PORT=${TRITON_GRPC_PORT:-8001}
METRICS_PORT=${TRITON_METRICS_PORT:-8002}
ADMIN_KEY_FILE=${TRITONSTACK_ADMIN_KEY_FILE:-$CACHE/admin-key}
RESTRICTED_APIS="model-repository,shared-memory,statistics,trace,logging"
ADMIN_HEADER=tritonstack-admin-key
ADMIN_APIS="model-repository,statistics"
SHUT_HEADER=tritonstack-shut-key
WATCHDOG=${TRITONSTACK_WATCHDOG:-on}
WATCHDOG_INTERVAL=${TRITONSTACK_WATCHDOG_INTERVAL:-5}
WATCHDOG_FAILURES=${TRITONSTACK_WATCHDOG_FAILURES:-3}
# The deep probe finds Triton where the healthcheck does: $TRITONSTACK_SERVING_NAME's address.
WATCHDOG_PROBE=${TRITONSTACK_WATCHDOG_PROBE:-python3 $HOME_DIR/healthcheck.py}

# Everything goes to stderr: tensorrt_plan's stdout is the plan path its caller captures.
log() { printf '[entrypoint] %s\n' "$*" >&2; }
die() {
  printf '[entrypoint] ERROR: %s\n' "$*" >&2
  exit 1
}

# --- what a config.pbtxt says (comments stripped; one model per file) ---------------------------

config_text() { sed 's/#.*//' "$1/config.pbtxt"; }

needs_gpu() {
  config_text "$1" | grep -Eq 'platform:[[:space:]]*"tensorrt_plan"|KIND_GPU'
}

is_tensorrt_plan() {
  config_text "$1" | grep -Eq 'platform:[[:space:]]*"tensorrt_plan"'
}

max_batch_size() {
  config_text "$1" | sed -n 's/^[[:space:]]*max_batch_size:[[:space:]]*\([0-9][0-9]*\).*/\1/p' |
    head -n 1
}

# The string value of config parameter $2 of model directory $1, as tritonstack add-model writes
# it (`key: "..."`, then `string_value: "..."`); empty when the config has none.
config_parameter() {
  config_text "$1" | awk -v key="$2" '
    index($0, "key: \"" key "\"") { found = 1; next }
    found && /string_value:/ { sub(/^[^"]*"/, ""); sub(/"[[:space:]]*$/, ""); print; exit }'
}

# "name dim1xdim2..." for each entry of the top-level `input [ ... ]` block.
config_inputs() {
  config_text "$1" | awk '
    /^input[[:space:]]*\[/ { inside = 1; next }
    inside && /^\]/ { inside = 0 }
    inside && /name:/ { match($0, /"[^"]*"/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    inside && /dims:/ {
      dims = $0; sub(/.*\[/, "", dims); sub(/\].*/, "", dims); gsub(/[[:space:],]+/, "x", dims)
      sub(/^x/, "", dims); sub(/x$/, "", dims); print name, dims
    }'
}

# --- GPU detection ------------------------------------------------------------------------------

GPU_NAME='' GPU_CC=''

detect_gpu() {
  local out lines listed
  command -v nvidia-smi >/dev/null 2>&1 || {
    log "no nvidia-smi in the container: no GPU was handed to it"
    return 1
  }
  if ! out=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>&1); then
    # A driver that lists GPUs but cannot report compute_cap (R470 and older) is too old for
    # this image: stop rather than serve on CPU with a GPU reserved.
    if listed=$(nvidia-smi -L 2>/dev/null) && [[ $listed == *GPU* ]]; then
      die "nvidia-smi lists ${listed//$'\n'/; } but cannot report its compute capability" \
        "(${out//$'\n'/ }): the driver is too old for this image (CUDA 13: driver R$MIN_DRIVER or" \
        "later, docs/deployment.md prerequisites). Update the driver, or serve on CPU" \
        "deliberately with TRITONSTACK_DEVICE=cpu (compose.cpu.yml)"
    fi
    log "WARNING: nvidia-smi is in the container but failed (${out//$'\n'/ }), so this" \
      "container serves on CPU. If it was given a GPU, the host's driver is broken;" \
      "TRITONSTACK_DEVICE=gpu makes this fatal, TRITONSTACK_DEVICE=cpu makes CPU deliberate"
    return 1
  fi
  lines=$(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d' | sort -u)
  [[ -n $lines ]] || {
    log "nvidia-smi lists no GPU"
    return 1
  }
  if (($(printf '%s\n' "$lines" | wc -l) > 1)); then
    die "GPUs of different kinds are visible (${lines//$'\n'/; }); a TensorRT plan runs on one" \
      "kind only: hand the container GPUs of one model (compose device_ids)"
  fi
  GPU_NAME=${lines%,*}
  GPU_CC=${lines##*,}
  GPU_CC=${GPU_CC//[[:space:]]/}
  [[ $GPU_CC =~ ^[0-9]+\.[0-9]+$ ]] ||
    die "nvidia-smi reports compute capability '$GPU_CC' for $GPU_NAME; expected <major>.<minor>"
  log "GPU: $GPU_NAME, compute capability $GPU_CC ($(printf '%s\n' "$out" | wc -l) visible)"
  if ! cc_at_least "$GPU_CC" "$MIN_COMPUTE_CAPABILITY"; then
    die "$GPU_NAME has compute capability $GPU_CC; this image's Triton release supports" \
      "$MIN_COMPUTE_CAPABILITY and later: serve on CPU with TRITONSTACK_DEVICE=cpu" \
      "(docker compose -f docker-compose.yml -f compose.cpu.yml up) or use a newer GPU"
  fi
  check_driver
}

# A driver older than the image's CUDA runs it with fewer features or not at all: say which,
# once, at start (the host's driver, not the container's, decides).
check_driver() {
  local version major
  version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1) ||
    true
  major=${version%%.*}
  if [[ ! $major =~ ^[0-9]+$ ]]; then
    log "WARNING: nvidia-smi reports no driver version ('$version'); cannot check it against" \
      "CUDA 13 (R$RECOMMENDED_DRIVER recommended)"
  elif ((major < MIN_DRIVER)); then
    log "WARNING: driver $version is older than R$MIN_DRIVER: CUDA 13 runs only through" \
      "forward compatibility (data-center GPUs); update to R$RECOMMENDED_DRIVER or later" \
      "(docs/deployment.md prerequisites)"
  elif ((major < RECOMMENDED_DRIVER)); then
    log "driver $version: CUDA 13.4 in minor-version compatibility mode (PTX newer than the" \
      "driver cannot be compiled); R$RECOMMENDED_DRIVER or later runs it fully"
  else
    log "driver $version"
  fi
}

# cc_at_least 8.6 7.5: compute capability $1 >= $2.
cc_at_least() {
  local major=${1%%.*} minor=${1#*.} min_major=${2%%.*} min_minor=${2#*.}
  ((major > min_major || (major == min_major && minor >= min_minor)))
}

# trtexec's banner: "&&&& RUNNING TensorRT.trtexec [TensorRT v100500] # trtexec --help".
tensorrt_version() {
  if [[ -n ${TENSORRT_VERSION:-} ]]; then
    printf '%s\n' "$TENSORRT_VERSION"
    return
  fi
  local number
  number=$(printf '%s\n' "$TRTEXEC_HELP" | sed -n 's/.*\[TensorRT v\([0-9][0-9]*\)\].*/\1/p' |
    head -n 1) || true
  if [[ -n $number ]]; then
    printf '%d.%d.%d\n' $((number / 10000)) $((number / 100 % 100)) $((number % 100))
  else # unknown banner: the binary's hash still changes with every TensorRT release
    printf 'trtexec-%s\n' "$(sha256sum "$(command -v trtexec)" | cut -c1-12)"
  fi
}

slug() { printf '%s' "$*" | tr -c 'A-Za-z0-9._-' '_'; }

# --- TensorRT plans -----------------------------------------------------------------------------

# Prints the path of the plan for model directory $1 (built now, or reused from the cache).
tensorrt_plan() {
  local model=$1 name source onnx max opt inputs input dims key dir started seconds
  name=$(basename "$model")
  source=${name%_trt}
  onnx=$REPOSITORY/$source/1/model.onnx
  [[ $name != "$source" && -f $onnx ]] ||
    die "$name: platform tensorrt_plan without $name/1/model.plan, and no ONNX twin to build it" \
      "from (expected ${onnx}); commit a plan or name the model <onnx model>_trt"
  local shapes=(--minShapes= --optShapes= --maxShapes=) rows i given
  # tritonstack add-model writes the profile from the inputs' bounds (names quoted for trtexec);
  # a hand-written config gets one from max_batch_size and its fixed dims.
  given=$(config_parameter "$model" tritonstack.trtexec_min_shapes)
  if [[ -n $given ]]; then
    shapes=("--minShapes=$given"
      "--optShapes=$(config_parameter "$model" tritonstack.trtexec_opt_shapes)"
      "--maxShapes=$(config_parameter "$model" tritonstack.trtexec_max_shapes)")
  else
    max=$(max_batch_size "$model")
    [[ -n $max && $max -gt 0 ]] || die "$name: max_batch_size must be > 0 to build a plan"
    opt=$((OPT_BATCH < max ? OPT_BATCH : max))
    inputs=$(config_inputs "$model")
    [[ -n $inputs ]] || die "$name/config.pbtxt: no input with dims found"
    rows=(1 "$opt" "$max")
    while read -r input dims; do
      for i in 0 1 2; do
        [[ ${shapes[i]} == *= ]] || shapes[i]+=,
        shapes[i]+="$input:${rows[i]}x$dims"
      done
    done <<<"$inputs"
  fi
  local build=(--onnx="$onnx" "${shapes[@]}" "${PRECISION_FLAGS[@]}")
  key="gpu=$GPU_NAME
compute_capability=$GPU_CC
tensorrt=$TRT_VERSION
onnx_sha256=$(sha256sum "$onnx" | cut -d' ' -f1)
build=${build[*]:1}"
  dir=$CACHE/plans/$name/$(slug "$GPU_NAME")-sm${GPU_CC//./}-trt$TRT_VERSION-$(
    printf '%s' "$key" | sha256sum | cut -c1-12
  )
  mkdir -p "$dir"
  # One builder per plan: replicas sharing the cache volume start together. The lock is this
  # function's (it runs in $(...)), so it is released when the function returns or dies.
  lock_or_wait "$dir/lock" "$name: another replica is building this plan; waiting for it"
  if plan_is_valid "$dir" "$key"; then
    log "$name: reusing the cached plan $dir/model.plan (same GPU, TensorRT and model)"
    printf '%s\n' "$dir/model.plan"
    return
  fi
  [[ ! -e $dir/model.plan ]] ||
    log "$name: the cached plan in $dir is incomplete or does not match its checksum" \
      "(truncated or changed); rebuilding it"
  rm -f "$dir/key" "$dir/model.plan.sha256" # no valid entry until the new plan is complete
  log "$name: building a TensorRT plan for $GPU_NAME (compute capability $GPU_CC, TensorRT $TRT_VERSION):" \
    "trtexec ${build[*]}; first start only, cached afterwards"
  started=$(date +%s)
  # trtexec's own progress goes to the container log (prefixed) and to trtexec.log in the cache.
  if ! trtexec "${build[@]}" --saveEngine="$dir/model.plan.tmp" --skipInference 2>&1 |
    tee "$dir/trtexec.log" | sed 's/^/  trtexec: /' >&2; then
    rm -f "$dir/model.plan.tmp"
    die "$name: trtexec failed; full log in $dir/trtexec.log"
  fi
  [[ -s $dir/model.plan.tmp ]] ||
    die "$name: trtexec reported success but wrote no plan to $dir/model.plan.tmp (disk full?);" \
      "full log in $dir/trtexec.log"
  seconds=$(($(date +%s) - started))
  # Plan, then its checksum, then the key: a reader trusts the plan only when all three agree.
  sha256sum <"$dir/model.plan.tmp" | cut -d' ' -f1 >"$dir/model.plan.sha256.tmp"
  mv -f "$dir/model.plan.tmp" "$dir/model.plan"
  mv -f "$dir/model.plan.sha256.tmp" "$dir/model.plan.sha256"
  printf '%s\n' "$key" >"$dir/key.tmp"
  mv -f "$dir/key.tmp" "$dir/key"
  log "$name: plan built in ${seconds} s: $dir/model.plan ($(wc -c <"$dir/model.plan") bytes)"
  printf '%s\n' "$dir/model.plan"
}

# The cached plan in $1 was built for key $2 and is the file that build wrote, byte for byte.
plan_is_valid() {
  local dir=$1 key=$2
  [[ -f $dir/model.plan && -f $dir/key && -f $dir/model.plan.sha256 ]] || return 1
  [[ $(<"$dir/key") == "$key" ]] || return 1
  [[ $(sha256sum <"$dir/model.plan" | cut -d' ' -f1) == "$(<"$dir/model.plan.sha256")" ]]
}

# lock_or_wait FILE MESSAGE...: take an exclusive lock on FILE for the rest of this shell (fd in
# LOCK_FD), saying MESSAGE while another process holds it, for at most CACHE_LOCK_TIMEOUT.
LOCK_FD=''
lock_or_wait() {
  local file=$1 message=${*:2}
  exec {LOCK_FD}>"$file"
  flock -n "$LOCK_FD" && return 0
  log "$message (up to ${CACHE_LOCK_TIMEOUT}s; lock $file)"
  flock -w "$CACHE_LOCK_TIMEOUT" "$LOCK_FD" ||
    die "$file stayed locked for ${CACHE_LOCK_TIMEOUT}s: the replica holding it is stuck;" \
      "restart it, or raise TRITONSTACK_CACHE_LOCK_TIMEOUT"
}

# A model directory whose version 1 gets the built plan; everything else links to the original.
link_with_plan() {
  local model=$1 target=$2 plan=$3 entry
  mkdir -p "$target/1"
  for entry in "$model"/* "$model"/.[!.]*; do
    [[ -e $entry && $(basename "$entry") != 1 ]] || continue
    ln -s "$entry" "$target/$(basename "$entry")"
  done
  for entry in "$model"/1/* "$model"/1/.[!.]*; do
    [[ -e $entry ]] || continue
    ln -s "$entry" "$target/1/$(basename "$entry")"
  done
  ln -s "$plan" "$target/1/model.plan"
}

# --- main ---------------------------------------------------------------------------------------

[[ -d $REPOSITORY ]] || die "model repository $REPOSITORY not found"
[[ -f $FLAGS_FILE ]] || die "shared tritonserver flags $FLAGS_FILE not found"
# A stale image: compose gives the checkout's PUBLIC_MODELS (env_file: stack.env), and the
# gateway routes them from the checkout's gateway/models.map, but the repository is the one
# baked in at build time. A model added since (`tritonstack add-model`) would be routed to a
# server that lacks it: stop, saying how to rebuild, rather than serve a stack that disagrees.
missing=()
for name in ${PUBLIC_MODELS:-}; do
  [[ -f $REPOSITORY/$name/config.pbtxt ]] || missing+=("$name")
done
((${#missing[@]} == 0)) || die "this image's model repository has no ${missing[*]}, which" \
  "stack.env makes public: the image was built before the model was added; rebuild it:" \
  "docker compose up -d --build"

case $DEVICE in
  auto) if detect_gpu; then DEVICE=gpu; else DEVICE=cpu; fi ;;
  gpu) detect_gpu || die "TRITONSTACK_DEVICE=gpu but no GPU is visible; on a CPU-only host run" \
    "docker compose -f docker-compose.yml -f compose.cpu.yml up" ;;
  cpu) log "TRITONSTACK_DEVICE=cpu: GPU detection skipped" ;;
  *) die "TRITONSTACK_DEVICE=$DEVICE: use auto, gpu or cpu" ;;
esac
log "serving on $DEVICE"

# The build's precision flags, from TRT_PRECISION and what this trtexec accepts.
PRECISION_FLAGS=()
choose_precision() {
  local takes_fp16=0
  if printf '%s\n' "$TRTEXEC_HELP" | grep -Eq '^[[:space:]]*--fp16([[:space:]]|$)'; then
    takes_fp16=1
  fi
  case $PRECISION in
    auto | fp16)
      if ((takes_fp16)); then
        PRECISION_FLAGS=(--fp16)
        log "TensorRT plans in FP16 (--fp16; TRT_PRECISION=$PRECISION)"
      elif [[ $PRECISION == fp16 ]]; then
        die "TRT_PRECISION=fp16, but trtexec of TensorRT $TRT_VERSION has no --fp16 (TensorRT 11" \
          "builds strongly typed networks: a plan runs in the ONNX model's own types). Convert" \
          "the model to FP16 (ModelOpt AutoCast, docs/deployment.md) or set TRT_PRECISION=auto"
      else
        log "TensorRT $TRT_VERSION builds strongly typed networks (its trtexec has no --fp16):" \
          "plans keep the ONNX model's precision; for FP16 convert the model (docs/deployment.md)"
      fi
      ;;
    fp32) log "TensorRT plans in the ONNX model's precision (TRT_PRECISION=fp32)" ;;
    *) die "TRT_PRECISION=$PRECISION: use auto, fp16 or fp32" ;;
  esac
  # Without FP16 a plan is meant to keep the model's FP32, but trtexec lets FP32 matrix products
  # run in TF32 (10 mantissa bits) by default: --noTF32 keeps them FP32.
  if [[ ${#PRECISION_FLAGS[@]} -eq 0 ]] &&
    printf '%s\n' "$TRTEXEC_HELP" | grep -Eq '^[[:space:]]*--noTF32([[:space:]]|$)'; then
    PRECISION_FLAGS=(--noTF32)
    log "TensorRT plans keep FP32 matrix products in FP32 (--noTF32; TF32 is trtexec's default)"
  fi
}

if [[ $DEVICE == gpu ]]; then
  command -v trtexec >/dev/null 2>&1 || die "trtexec not found on PATH (/usr/src/tensorrt/bin)"
  # One call: the banner has the version, the option list says which precision flags exist.
  TRTEXEC_HELP=$(trtexec --help 2>&1) || true
  TRT_VERSION=$(tensorrt_version)
  log "TensorRT $TRT_VERSION"
  choose_precision
  # ONNX Runtime's TensorRT engine cache (configs/gpu.pbtxt: $CACHE/onnxruntime-trt) is checked
  # against neither the GPU nor the weights (its id hashes the model's file name, tensor names
  # and library versions), so it points into a directory keyed by GPU, TensorRT and the hash of
  # every ONNX file in the repository: new weights get a new engine, never the old one.
  onnx_key=$(cd "$REPOSITORY" && find . -name '*.onnx' -type f -print0 | sort -z |
    xargs -0r sha256sum | sha256sum | cut -c1-12)
  ort_dir=$CACHE/onnxruntime-trt-keys/$(slug "$GPU_NAME")-sm${GPU_CC//./}-trt$TRT_VERSION-onnx$onnx_key
  mkdir -p "$ort_dir"
  ln -sfn "$ort_dir" "$ORT_CACHE_LINK"
fi

rm -rf "$VIEW"
mkdir -p "$VIEW"
served=() skipped=()
for model in "$REPOSITORY"/*/; do
  model=${model%/}
  name=$(basename "$model")
  [[ -f $model/config.pbtxt ]] || continue
  if [[ $DEVICE == cpu ]] && needs_gpu "$model"; then
    skipped+=("$name")
  elif [[ $DEVICE == gpu ]] && is_tensorrt_plan "$model" && [[ ! -e $model/1/model.plan ]]; then
    plan=$(tensorrt_plan "$model")
    link_with_plan "$model" "$VIEW/$name" "$plan"
    served+=("$name")
  else
    ln -s "$model" "$VIEW/$name"
    served+=("$name")
  fi
done
((${#served[@]})) || die "no servable model in $REPOSITORY"
log "models: ${served[*]}"
((${#skipped[@]} == 0)) || log "not served on CPU (GPU only): ${skipped[*]}"

shared=()
while IFS= read -r line || [[ -n $line ]]; do
  line=${line#"${line%%[![:space:]]*}"}
  line=${line%"${line##*[![:space:]]}"}
  [[ -z $line || $line == \#* ]] || shared+=("$line")
done <"$FLAGS_FILE"

# Where inference is served. In compose TRITONSTACK_SERVING_NAME is this service's alias on the
# network it shares with the gateway: HTTP and gRPC bind to this container's address there and
# nowhere else (metrics on every address, named: Triton's default is the HTTP address), so Prometheus, which reaches the container on another network for the metrics
# port, finds them closed (docs/security.md, "Who reaches what"). Unset (Kubernetes, where
# NetworkPolicies filter by port): every address.
SERVE_ADDRESS=0.0.0.0 SERVE_HOST=127.0.0.1
if [[ -n ${TRITONSTACK_SERVING_NAME:-} ]]; then
  SERVE_ADDRESS=$(python3 "$HOME_DIR/healthcheck.py" --address-of "$TRITONSTACK_SERVING_NAME") ||
    die "no address to serve on (above); TRITONSTACK_SERVING_NAME=$TRITONSTACK_SERVING_NAME"
  SERVE_HOST=$SERVE_ADDRESS
  log "inference on $SERVE_ADDRESS ($TRITONSTACK_SERVING_NAME), metrics on every address"
fi
# Ready (--strict-readiness: every model loaded and warmed up, so its engines are built).
READY_PROBE=${TRITONSTACK_READY_PROBE:-python3 -c "import urllib.request as u; u.urlopen('http://$SERVE_HOST:$HTTP_PORT/v2/health/ready', timeout=2)"}

args=(
  --model-repository="$VIEW"
  "${shared[@]}"
  --exit-timeout-secs="$EXIT_TIMEOUT"
  --http-address="$SERVE_ADDRESS"
  --http-port="$HTTP_PORT"
  --grpc-address="$SERVE_ADDRESS"
  --grpc-port="$GRPC_PORT"
  --metrics-address=0.0.0.0
  --metrics-port="$METRICS_PORT"
)
if [[ $DEVICE == gpu ]]; then
  args+=(--allow-gpu-metrics=true --model-config-name=gpu)
else
  args+=(--allow-gpu-metrics=false)
fi

# --- admin APIs behind a secret header (docs/security.md) ----------------------------------------
# TRITONSTACK_ADMIN_KEY, else the key file (compose's secrets volume, a Kubernetes Secret
# mounted read-only), else one generated on first start (0600): in the key file's place when
# it can be written there, in the cache volume when not (an optional Secret that does not exist).
new_key() {
  mkdir -p "$(dirname "$1")" 2>/dev/null &&
    (umask 077 && head -c 32 /dev/urandom | base64 | tr -d '/+=\n' >"$1") 2>/dev/null &&
    log "generated the admin key in $1"
}
admin_key() {
  if [[ -n ${TRITONSTACK_ADMIN_KEY:-} ]]; then
    printf '%s\n' "$TRITONSTACK_ADMIN_KEY"
    return
  fi
  local file=$ADMIN_KEY_FILE
  if [[ ! -s $file ]] && ! new_key "$file"; then
    file=$CACHE/admin-key
    [[ -s $file ]] || new_key "$file" || die "cannot write the admin key to $file"
  fi
  cat "$file"
}
# The admin key opens ADMIN_APIS (what the stack's tools call) and those TRITONSTACK_ADMIN_APIS
# asks for; every other restricted API is shut: behind a key drawn now and kept nowhere but
# tritonserver's command line.
wanted=,$ADMIN_APIS,${TRITONSTACK_ADMIN_APIS:-},
admin='' shut=''
IFS=, read -ra restricted <<<"$RESTRICTED_APIS"
for api in "${restricted[@]}"; do
  if [[ $wanted == *,"$api",* ]]; then
    admin+=${admin:+,}$api
  else
    shut+=${shut:+,}$api
  fi
done
key=$(admin_key)
args+=(
  --http-restricted-api="$admin:$ADMIN_HEADER=$key"
  --grpc-restricted-protocol="$admin:$ADMIN_HEADER=$key"
)
if [[ -n $shut ]]; then
  shut_key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  args+=(
    --http-restricted-api="$shut:$SHUT_HEADER=$shut_key"
    --grpc-restricted-protocol="$shut:$SHUT_HEADER=$shut_key"
  )
fi

# --- watchdog: "ready" does not prove answers; a real inference does ----------------------------
# Armed by the first successful probe (models have loaded), it sends SIGTERM to tritonserver after
# WATCHDOG_FAILURES failed probes in a row: the container exits and compose's restart policy
# starts a new one (Docker does not restart a container that is merely unhealthy). The probe
# (healthcheck.py) fails only for a dead server: connection refused, a model that answers an
# error such as "Stub process ... is not healthy", or a wrong answer. A busy server (a 503, a
# timeout under load) passes: restarting it would only turn load into an outage.
watchdog() {
  local server=$1 failures=0 armed=0 parent
  while sleep "$WATCHDOG_INTERVAL"; do
    # Orphaned (tritonserver, our parent after `exec`, has exited): nothing left to watch.
    read -r _ _ _ parent _ <"/proc/$BASHPID/stat"
    ((parent == server)) || return 0
    if bash -c "$WATCHDOG_PROBE" >/dev/null 2>&1; then
      ((armed)) || log "watchdog: deep probe passed; watching every ${WATCHDOG_INTERVAL}s"
      armed=1 failures=0
    elif ((armed)); then
      failures=$((failures + 1))
      log "watchdog: deep probe failed ($failures/$WATCHDOG_FAILURES)"
      if ((failures >= WATCHDOG_FAILURES)); then
        log "watchdog: stopping tritonserver so the restart policy starts a fresh container"
        kill -TERM "$server"
        return 0
      fi
    fi
  done
}
# --- engine guard: one replica at a time loads models against ONNX Runtime's engine cache ------
# ONNX Runtime writes an engine with a plain file write while the model warms up, so a replica
# loading at the same moment could read it half-written. This replica holds the cache
# directory's lock until its models are ready (so its engines are written); the next replica
# waits here, then finds them. The guard inherits the lock's file descriptor and tritonserver
# does not (closed before `exec`): the lock goes when the models are ready, when tritonserver
# exits, or after the timeout.
engine_guard() {
  local server=$1 deadline=$((SECONDS + CACHE_LOCK_TIMEOUT)) parent
  while sleep 0.5; do
    read -r _ _ _ parent _ <"/proc/$BASHPID/stat"
    ((parent == server)) || return 0
    if bash -c "$READY_PROBE" >/dev/null 2>&1; then
      log "models ready: ONNX Runtime's engine cache is released to the other replicas"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      log "WARNING: models not ready after ${CACHE_LOCK_TIMEOUT}s; releasing the engine cache"
      return 0
    fi
  done
}
if [[ $DEVICE == gpu ]]; then
  lock_or_wait "$ort_dir.lock" "another replica is loading its models against ONNX Runtime's" \
    "engine cache $ort_dir; waiting until they are ready"
  engine_guard $$ &
  exec {LOCK_FD}>&- # this shell becomes tritonserver: only the guard keeps the lock
fi

if [[ $WATCHDOG == on ]]; then
  # After `exec`, tritonserver keeps this shell's PID ($$), which the watchdog signals.
  watchdog $$ &
fi

shown=("${args[@]//$ADMIN_HEADER=*/$ADMIN_HEADER=<secret>}")
log "exec tritonserver ${shown[*]//$SHUT_HEADER=*/$SHUT_HEADER=<secret>} $*"
exec tritonserver "${args[@]}" "$@"
