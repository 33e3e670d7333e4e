#!/bin/sh
# Secrets the stack must not ship with defaults, generated on first start: compose's one-shot
# `secrets` service runs `generate` before the services that read them, into the `secrets`
# volume. `show` prints them: `docker compose run --rm secrets show`.
#
# TRITONSTACK_SECRETS lists one secret per word: <file>:<uid>[:<VARIABLE>]. A missing or empty
# file gets 48 random hex characters (192 bits); if VARIABLE is set and not empty, its value is
# written instead (an override from .env). The file belongs to <uid> (the one service that reads
# it) with mode 0400, its directory 0711 (reachable, not listable). An existing secret is never
# regenerated, so restarts keep passwords and keys stable.
#
# POSIX sh and busybox tools only: it runs in the busybox image (docker-compose.yml) and here in
# tests/unit/test_compose.py.
set -eu

usage() {
  echo "usage: $0 generate|show (secrets listed in TRITONSTACK_SECRETS)" >&2
  exit 2
}

[ $# -eq 1 ] || usage
: "${TRITONSTACK_SECRETS:?lists the secrets as <file>:<uid>[:<VARIABLE>] words}"

random_secret() {
  od -An -tx1 -N24 /dev/urandom | tr -d ' \n'
}

generate() {
  file=$1 owner=$2 variable=$3
  override=''
  if [ -n "$variable" ]; then
    eval "override=\${$variable:-}"
  fi
  dir=$(dirname "$file")
  mkdir -p "$dir"
  chmod 0711 "$dir"
  if [ -s "$file" ] && { [ -z "$override" ] || [ "$(cat "$file")" = "$override" ]; }; then
    echo "secrets: $(basename "$file") kept"
  else
    tmp="$file.tmp.$$"
    (
      umask 077
      if [ -n "$override" ]; then
        printf '%s' "$override" >"$tmp"
      else
        random_secret >"$tmp"
      fi
    )
    [ -s "$tmp" ] || {
      rm -f "$tmp"
      echo "secrets: could not write $(basename "$file")" >&2
      exit 1
    }
    mv -f "$tmp" "$file"
    if [ -n "$override" ]; then
      echo "secrets: $(basename "$file") set from $variable"
    else
      echo "secrets: $(basename "$file") generated"
    fi
  fi
  # Only root can give the file to its reader; as another user the file stays with it.
  if [ "$(id -u)" = 0 ]; then
    chown "$owner" "$file"
  fi
  chmod 0400 "$file"
}

for entry in $TRITONSTACK_SECRETS; do
  file=${entry%%:*}
  rest=${entry#*:}
  owner=${rest%%:*}
  variable=''
  [ "$rest" = "$owner" ] || variable=${rest#*:}
  case $owner:$variable in
    :* | *[!0-9]*:* | *:*[!A-Za-z0-9_]* | *:[0-9]*)
      echo "secrets: $entry: expected <file>:<uid>[:<VARIABLE>]" >&2
      exit 2
      ;;
  esac
  case $1 in
    generate) generate "$file" "$owner" "$variable" ;;
    show)
      if [ -s "$file" ]; then
        printf '%s: %s\n' "$(basename "$file")" "$(cat "$file")"
      else
        printf '%s: (not generated yet: docker compose up first)\n' "$(basename "$file")"
      fi
      ;;
    *) usage ;;
  esac
done
