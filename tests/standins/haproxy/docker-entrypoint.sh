#!/bin/sh
# The official image's entrypoint, behaviour for behaviour: options alone run haproxy, and
# haproxy runs in master-worker mode (-W: SIGUSR2 reloads) in the foreground (-db).
set -e
if [ "${1#-}" != "$1" ]; then
  set -- haproxy "$@"
fi
if [ "$1" = haproxy ]; then
  shift
  set -- haproxy -W -db "$@"
fi
exec "$@"
