#!/bin/sh
# Secrets the stack must not ship with defaults, generated on first start: compose's one-shot
# `secrets` service runs `generate` before the services that read them, into the `secrets`
# volume. `show` prints them: `docker compose run --rm secrets show`.
#
# TRITONSTACK_SECRETS lists one secret per word: <file>:<uid>[:<override file>]. A missing or
# empty file gets 48 random hex characters (192 bits); if the override file (an absolute path:
# the checkout's secrets/ folder, mounted read-only) holds a value, that value is written instead,
# trailing newlines dropped. A file, not an environment variable, so that no value shows in
# `docker inspect`. The file belongs to <uid> (the one service that reads it) with mode 0400, its
# directory 0711 (reachable, not listable). An existing secret is never regenerated, so restarts
# keep passwords and keys stable.
#
# TRITONSTACK_OPTIONAL_SECRETS (optional) lists secrets only you can give, as
# <file>:<uid>:<override file> words: copied (0400, owned by <uid>) while the override file holds
# a value, and never generated: without one the file is removed, so its reader sees no value
# (a made-up Hugging Face token would be refused by the Hub, even for a public model).
#
# TRITONSTACK_KEY_MAP (optional), <file>:<uid>: the gateway's map of API keys, rewritten by every
# `generate` from the secrets whose file name ends in `-api-key`: one `<key> <client>` line each,
# the client being the name before `-api-key` (client-api-key -> client), so the gateway knows
# each caller's key while every caller reads only its own file.
#
# POSIX sh and busybox tools only: it runs in the busybox image (docker-compose.yml) and here in
# tests/unit/test_compose.py.
set -eu

usage() {
  echo "usage: $0 generate|show (secrets listed in TRITONSTACK_SECRETS)" >&2
  exit 2
}

[ $# -eq 1 ] || usage
if [ -z "${TRITONSTACK_SECRETS:-}${TRITONSTACK_OPTIONAL_SECRETS:-}" ]; then
  echo "secrets: TRITONSTACK_SECRETS lists the secrets as <file>:<uid>[:<override file>] words" >&2
  exit 2
fi

random_secret() {
  od -An -tx1 -N24 /dev/urandom | tr -d ' \n'
}

generate() {
  file=$1 owner=$2 source=$3 optional=${4:-}
  override=''
  if [ -n "$source" ] && [ -r "$source" ]; then
    override=$(cat "$source")
  fi
  dir=$(dirname "$file")
  mkdir -p "$dir"
  chmod 0711 "$dir"
  if [ -n "$optional" ] && [ -z "$override" ]; then
    rm -f "$file"
    echo "secrets: $(basename "$file") not set (optional: your secrets/$(basename "$source"))"
    return
  fi
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
      echo "secrets: $(basename "$file") set from your secrets/$(basename "$source")"
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

# write_key_map FILE UID: `<key> <client>` for each *-api-key secret, owned by UID, mode 0400.
write_key_map() {
  map=$1 owner=$2
  tmp="$map.tmp.$$"
  (
    umask 077
    : >"$tmp"
    for entry in $TRITONSTACK_SECRETS; do
      file=${entry%%:*}
      case $(basename "$file") in
        *-api-key) printf '%s %s\n' "$(cat "$file")" "$(basename "$file" -api-key)" >>"$tmp" ;;
      esac
    done
  )
  mv -f "$tmp" "$map"
  if [ "$(id -u)" = 0 ]; then
    chown "$owner" "$map"
  fi
  chmod 0400 "$map"
  echo "secrets: $(basename "$map") written ($(wc -l <"$map" | tr -d ' ') keys)"
}

# each_secret WORDS OPTIONAL FORMAT: runs $action on each <file>:<uid>[:<override file>] word.
each_secret() {
  for entry in $1; do
    file=${entry%%:*}
    rest=${entry#*:}
    owner=${rest%%:*}
    source=''
    [ "$rest" = "$owner" ] || source=${rest#*:}
    case $owner:$source:$2 in
      :* | *[!0-9]*:*:* | *:[!/]*:* | *::optional)
        echo "secrets: $entry: expected <file>:<uid>$3" >&2
        exit 2
        ;;
    esac
    case $action in
      generate) generate "$file" "$owner" "$source" "$2" ;;
      show)
        if [ -n "$2" ]; then
          # Your own third-party token: named, never printed.
          if [ -s "$file" ]; then
            printf '%s: set from your secrets/%s\n' "$(basename "$file")" "$(basename "$source")"
          else
            printf '%s: not set (optional)\n' "$(basename "$file")"
          fi
        elif [ -s "$file" ]; then
          printf '%s: %s\n' "$(basename "$file")" "$(cat "$file")"
        else
          printf '%s: (not generated yet: docker compose up first)\n' "$(basename "$file")"
        fi
        ;;
      *) usage ;;
    esac
  done
}

action=$1
each_secret "${TRITONSTACK_SECRETS:-}" "" "[:<override file>]"
each_secret "${TRITONSTACK_OPTIONAL_SECRETS:-}" optional ":<override file>"

if [ "$1" = generate ] && [ -n "${TRITONSTACK_KEY_MAP:-}" ]; then
  map=${TRITONSTACK_KEY_MAP%%:*}
  owner=${TRITONSTACK_KEY_MAP#*:}
  case $owner in
    "" | *[!0-9]*)
      echo "secrets: TRITONSTACK_KEY_MAP=$TRITONSTACK_KEY_MAP: expected <file>:<uid>" >&2
      exit 2
      ;;
  esac
  write_key_map "$map" "$owner"
fi
