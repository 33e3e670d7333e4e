#!/bin/bash
# The official image's /opt/nvidia/nvidia_entrypoint.sh pattern: print the banner, source each
# part in /opt/nvidia/entrypoint.d (none here: no GPU driver checks), then run the arguments,
# or bash without any.
shopt -s nullglob
echo "== Triton Inference Server (tritonstack stand-in: Triton ${TRITON_SERVER_VERSION}, CPU) =="
for part in /opt/nvidia/entrypoint.d/*.sh; do
  # shellcheck source=/dev/null
  source "$part"
done
if (($# == 0)); then
  exec /bin/bash
fi
exec "$@"
