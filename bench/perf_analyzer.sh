#!/usr/bin/env bash
# GPU bench: perf_analyzer (Triton SDK image) against the compose stack's `triton` service, the
# same scenarios as `tritonstack bench` measures natively: classifier direct vs pipeline vs
# classify, HTTP (JSON and binary) vs gRPC, batch-1 requests, concurrency 1 -> 64.
# Run by the compose profile `bench` (docs/benchmarks.md); CSVs go to $RESULTS (default /results).
set -euo pipefail

host=${TRITON_HOST:-triton}
results=${RESULTS:-/results}
concurrencies=${CONCURRENCIES:-1 4 8 16 32 64}
mkdir -p "$results"
# perf_analyzer reads the statistics API, which the stack keeps behind its admin key (read from
# the triton-cache volume, mounted read-only). Without the file, it runs without the header.
key_file=${ADMIN_KEY_FILE:-/var/cache/tritonstack/admin-key}
header=()
if [[ -r $key_file ]]; then
  header=(-H "tritonstack-admin-key:$(cat "$key_file")")
fi

run() {  # model protocol extra-flags... ; one CSV per model and protocol
  local model=$1 protocol=$2 name=$3
  shift 3
  local port=8000 extra=("${header[@]}")
  if [[ $protocol == grpc ]]; then
    port=8001
    extra=()  # HTTP headers only; gRPC needs the key as triton-grpc-protocol-* metadata
  fi
  for c in $concurrencies; do
    perf_analyzer -m "$model" -i "$protocol" -u "$host:$port" -b 1 --shape features:128 \
      --concurrency-range "$c:$c" --measurement-interval 5000 --stability-percentage 10 \
      --percentile 99 "${extra[@]}" "$@" -f "$results/perf-$model-$name-c$c.csv"
  done
}

for model in classifier pipeline classify; do
  run "$model" http http-binary                 # perf_analyzer's HTTP default: binary tensors
  run "$model" http http-json --input-tensor-format json --output-tensor-format json
  run "$model" grpc grpc
done
echo "perf_analyzer CSVs in $results"
