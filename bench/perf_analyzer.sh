#!/usr/bin/env bash
# GPU bench: perf_analyzer (Triton SDK image) against the compose stack's `triton` service, the
# same scenarios as `python -m bench` measures natively: classifier direct vs pipeline vs
# classify, HTTP (JSON and binary) vs gRPC, batch-1 requests, concurrency 1 -> 64.
# Run by the compose profile `bench` (docs/benchmarks.md); CSVs go to $RESULTS (default /results).
set -euo pipefail

host=${TRITON_HOST:-triton}
http_port=${TRITON_HTTP_PORT:-8000}
grpc_port=${TRITON_GRPC_PORT:-8001}
results=${RESULTS:-/results}
concurrencies=${CONCURRENCIES:-1 4 8 16 32 64}
mkdir -p "$results"
# perf_analyzer reads the statistics API before and after every measurement whenever the server
# lists the extension, and stops when that call fails. The stack keeps the API behind its admin
# key (read from the secrets volume, mounted read-only). perf_analyzer sends each -H as an HTTP
# header, and over gRPC as call metadata, where Triton's restricted-protocol check looks for the
# key under `triton-grpc-protocol-<header>`.
key_file=${ADMIN_KEY_FILE:-/run/secrets/tritonstack/admin-key}
if [[ ! -r $key_file ]]; then
  echo "perf_analyzer.sh: cannot read the admin key $key_file (set ADMIN_KEY_FILE); perf_analyzer needs it for the statistics API" >&2
  exit 1
fi
key=$(<"$key_file")
header=tritonstack-admin-key

run() {  # model protocol name extra-flags... ; one CSV per model, protocol and concurrency
  local model=$1 protocol=$2 name=$3
  shift 3
  local url=$host:$http_port auth=$header:$key
  if [[ $protocol == grpc ]]; then
    url=$host:$grpc_port auth=triton-grpc-protocol-$header:$key
  fi
  for c in $concurrencies; do
    perf_analyzer -m "$model" -i "$protocol" -u "$url" -H "$auth" -b 1 --shape features:128 \
      --concurrency-range "$c:$c" --measurement-interval 5000 --stability-percentage 10 \
      --percentile 99 "$@" -f "$results/perf-$model-$name-c$c.csv"
  done
}

for model in classifier pipeline classify; do
  run "$model" http http-binary                 # perf_analyzer's HTTP default: binary tensors
  run "$model" http http-json --input-tensor-format json --output-tensor-format json
  run "$model" grpc grpc
done
echo "perf_analyzer CSVs in $results"
