#!/usr/bin/env bash
# End-to-end check of the Docker image on a local daemon (not part of the unit suite):
# build from this checkout, then run it as the README says and check from the outside:
#   /healthz from the host, the server process's non-root uid, the config mounted read-only and read
#   (its admin token guards /sessions), a streamed chat through the proxy to `context-proxy simulate`
#   in a second container, the session's SQLite state on the /data volume surviving a new container,
#   the HEALTHCHECK reaching "healthy", a graceful `docker stop`, and `context-proxy demo` in the
#   image with no network. It removes every container, network, volume and file it created; the
#   image it built stays (--rm-image removes it too).
#
# Where Docker Hub is reachable (the real python:3.11-slim base):
#   scripts/docker_check.sh
# Where it is not, but a Debian mirror is (root, debootstrap; the stand-in is built once, then reused):
#   scripts/docker_check.sh --standin            # BASE = scripts/standin_base.sh's image
# (no daemon yet on Debian: apt-get install docker.io debootstrap && dockerd --storage-driver=overlay2 &)
# Options: --base IMAGE (any python:3.11-slim look-alike), --tag NAME (default context-proxy:check),
#          --rm-image. Env: DOCKER (the client, default `docker`; it must build with BuildKit:
#          with Debian's docker.io beside a newer client that lacks buildx, DOCKER=/usr/bin/docker).
# pip inside the build reaches the index the way this machine's pip does: PIP_INDEX_URL /
# PIP_EXTRA_INDEX_URL (env or `pip config`, http(s) only) go in as build args, and PIP_CERT
# (env or `pip config`: a CA bundle, e.g. a TLS-intercepting proxy's) as a build secret, never
# into the image. Exit 0 only when every check passed; the last line is "N passed, N failed".
# shellcheck disable=SC2317  # the helpers below run through check/expect, which shellcheck cannot follow
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DOCKER=${DOCKER:-docker}
STANDIN_TAG=context-proxy-standin/python:3.11-slim
BASE=python:3.11-slim
TAG=context-proxy:check
RM_IMAGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --standin) BASE=$STANDIN_TAG ;;
        --base) BASE=$2; shift ;;
        --tag) TAG=$2; shift ;;
        --rm-image) RM_IMAGE=1 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 && !/shellcheck/' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

RUN=cpcheck-$$
TOKEN=check-$RANDOM$RANDOM
SESSION=docker-check
WORK=$(mktemp -d "/tmp/$RUN.XXXXXX")
CONTAINERS=() NETWORK="" VOLUME=""
PASSED=0 FAILED=0

cleanup() {
    for c in "${CONTAINERS[@]}"; do $DOCKER rm -f -v "$c" >/dev/null 2>&1; done
    [ -n "$NETWORK" ] && $DOCKER network rm "$NETWORK" >/dev/null 2>&1
    [ -n "$VOLUME" ] && $DOCKER volume rm "$VOLUME" >/dev/null 2>&1
    [ "$RM_IMAGE" = 1 ] && $DOCKER image rm "$TAG" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

pass() { PASSED=$((PASSED + 1)); echo "ok    $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL  $*"; }
check() {  # check "what" command...: pass when the command succeeds
    local what=$1; shift
    if "$@"; then pass "$what"; else fail "$what"; return 1; fi
}
finish() { echo "$PASSED passed, $FAILED failed"; [ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]; exit $?; }
die() { fail "$*"; finish; }

# --- the build --------------------------------------------------------------------------------------
host_pip() {  # host_pip ENV_NAME CONFIG_KEY: this machine's pip setting, env first
    local value=${!1:-}
    [ -n "$value" ] || value=$(python3 -m pip config get "global.$2" 2>/dev/null) || value=""
    echo "$value"
}

build_args=(--build-arg "BASE=$BASE")
for pair in PIP_INDEX_URL:index-url PIP_EXTRA_INDEX_URL:extra-index-url; do
    urls=$(host_pip "${pair%%:*}" "${pair#*:}" | tr ' ' '\n' | grep -E '^https?://' | tr '\n' ' ' | sed 's/ $//')
    [ -n "$urls" ] && build_args+=(--build-arg "${pair%%:*}=$urls") && echo "build: ${pair%%:*}=$urls (from this machine's pip)"
done
cert=$(host_pip PIP_CERT cert)
if [ -n "$cert" ] && [ -f "$cert" ]; then
    build_args+=(--secret "id=pip_cert,src=$cert")
    echo "build: pip's CA bundle $cert as a build secret (from this machine's pip)"
fi

if [ "$BASE" = "$STANDIN_TAG" ] && ! $DOCKER image inspect "$STANDIN_TAG" >/dev/null 2>&1; then
    echo "build: no $STANDIN_TAG yet; building it (debootstrap, a few minutes)"
    DOCKER=$DOCKER "$REPO/scripts/standin_base.sh" "$STANDIN_TAG" >"$WORK/standin.log" 2>&1 \
        || { tail -20 "$WORK/standin.log"; die "stand-in base built"; }
fi

echo "build: $TAG from $REPO on $BASE"
if DOCKER_BUILDKIT=1 $DOCKER build --progress=plain "${build_args[@]}" -t "$TAG" "$REPO" >"$WORK/build.log" 2>&1; then
    pass "image builds from the checkout ($(($($DOCKER image inspect -f '{{.Size}}' "$TAG") / 1000000)) MB, base $BASE)"
else
    tail -30 "$WORK/build.log"
    grep -q buildx "$WORK/build.log" && echo "hint: this client needs buildx for BuildKit; try DOCKER=/usr/bin/docker"
    die "image builds from the checkout"
fi
check "the image's user is non-root ($($DOCKER image inspect -f '{{.Config.User}}' "$TAG"))" \
    test "$($DOCKER image inspect -f '{{.Config.User}}' "$TAG" | cut -d: -f1)" -ne 0
# What the daemon receives as the build context: copied out through a throwaway build FROM scratch.
if printf 'FROM scratch\nCOPY . /\n' | DOCKER_BUILDKIT=1 $DOCKER build -q -f - -o "type=local,dest=$WORK/context" "$REPO" \
    >/dev/null 2>&1; then
    kept=$(cd "$WORK/context" && find . -mindepth 1 -maxdepth 1 -printf '%f ')
    extra=$(cd "$WORK/context" && find . -mindepth 1 \( -maxdepth 1 \( -name tests -o -name bench -o -name docs \
        -o -name scripts -o -name .git -o -name .ci -o -name '.*cache' -o -name .hypothesis -o -name .benchmarks \
        -o -name build -o -name dist \) \) -o -name __pycache__ -o -name '*.pyc' -o -name '*.sqlite*')
    check "the build context ($(du -sh "$WORK/context" | cut -f1): $kept) has no tests, bench, docs or caches" \
        test -z "$extra" || echo "      also sent: $extra"
else
    fail "the build context can be listed"
fi

# --- helpers for the running containers --------------------------------------------------------------
run() {  # run NAME ARGS...: a detached container this script owns
    local name=$RUN-$1; shift
    CONTAINERS+=("$name")
    $DOCKER run -d --name "$name" "$@" >/dev/null
}
host_port() { $DOCKER port "$RUN-$1" 8787/tcp | head -1 | sed 's/.*://'; }
http() {  # http PORT PATH [curl args...]: prints "STATUS BODY"
    local port=$1 path=$2; shift 2
    curl -sS --max-time 30 -o "$WORK/body" -w '%{http_code}' "$@" "http://127.0.0.1:$port$path" 2>/dev/null || true
    printf ' %s' "$(cat "$WORK/body" 2>/dev/null)"
}
wait_healthz() {  # wait_healthz NAME: up to 60 s for 200 on /healthz from the host
    local port
    for _ in $(seq 60); do
        port=$(host_port "$1" 2>/dev/null) && [ -n "$port" ] && [[ "$(http "$port" /healthz)" == 200* ]] && return 0
        sleep 1
    done
    $DOCKER logs "$RUN-$1" 2>&1 | tail -20
    return 1
}
stops_cleanly() {  # stops_cleanly NAME: `docker stop` ends it by SIGTERM with exit code 0, not SIGKILL after 10 s
    $DOCKER stop -t 10 "$RUN-$1" >/dev/null && test "$($DOCKER inspect -f '{{.State.ExitCode}}' "$RUN-$1")" = 0
}
expect() {  # expect "what" "STATUS BODY" PATTERN
    if [[ "$2" =~ $3 ]]; then pass "$1"; else fail "$1 (got: ${2:0:300})"; fi
}

# --- the README's first line: the packaged config ----------------------------------------------------
VOLUME=$RUN-state
$DOCKER volume create "$VOLUME" >/dev/null
run stock -p 127.0.0.1::8787 -v "$VOLUME:/data" "$TAG"
check "stock config: /healthz answers the host" wait_healthz stock
port=$(host_port stock)
expect "stock config: /healthz says ok" "$(http "$port" /healthz)" '^200 .*"status":"ok"'
expect "stock config: /sessions refused off loopback without an admin token" "$(http "$port" /sessions)" '^403 '
check "stock config: the log says 0.0.0.0 exposes /sessions and /metrics" \
    bash -c "$DOCKER logs $RUN-stock 2>&1 | grep -qi 'admin'"
$DOCKER rm -f -v "$RUN-stock" >/dev/null

# --- your own config, mounted read-only, upstream = `context-proxy simulate` in a second container ---
NETWORK=$RUN
$DOCKER network create "$NETWORK" >/dev/null
run sim --network "$NETWORK" --network-alias sim "$TAG" context-proxy simulate --host 0.0.0.0 --port 9000 --delay-ms 0

mkdir -p "$WORK/config" && cp -r "$REPO/proxy/data/config/." "$WORK/config/"
sed -i -e 's|^admin_token_env = ""|admin_token_env = "ADMIN_TOKEN"|' \
    -e 's|^base_url = "[^"]*"|base_url = "http://sim:9000/v1"|' \
    -e 's|^path = ""|path = "/data/journals.sqlite"|' "$WORK/config/proxy.toml"
for key in 'admin_token_env = "ADMIN_TOKEN"' 'base_url = "http://sim:9000/v1"' 'path = "/data/journals.sqlite"'; do
    grep -qF "$key" "$WORK/config/proxy.toml" || die "config edited ($key): the packaged proxy.toml changed shape"
done
chmod -R a+rX "$WORK"

serve_own_config() {  # the README's second line, on an ephemeral host port
    run "$1" --network "$NETWORK" -p 127.0.0.1::8787 -v "$WORK/config:/config:ro" -v "$VOLUME:/data" \
        -e ADMIN_TOKEN="$TOKEN" "$TAG" context-proxy serve --config /config/proxy.toml --host 0.0.0.0
}
serve_own_config proxy
check "own config: /healthz answers the host" wait_healthz proxy || die "the proxy did not start"
port=$(host_port proxy)
expect "own config: /healthz ok, no config error" "$(http "$port" /healthz)" '^200 .*"config_error":null'
uid=$($DOCKER exec "$RUN-proxy" stat -c %u /proc/1)
check "the server process runs as uid $uid, not root" test "${uid:-0}" -ne 0
check "the config mount is read-only (docker inspect)" test "$($DOCKER inspect -f \
    '{{range .Mounts}}{{if eq .Destination "/config"}}{{.RW}}{{end}}{{end}}' "$RUN-proxy")" = false
check "the config mount is read-only (a write inside fails)" \
    bash -c "! $DOCKER exec $RUN-proxy touch /config/written 2>/dev/null"
expect "the mounted config is read: /sessions needs its admin token" "$(http "$port" /sessions)" '^401 '

body='{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello from the docker check"}]}'
expect "a streamed chat through the proxy to the simulate container" \
    "$(http "$port" "/s/$SESSION/v1/chat/completions" -H 'Content-Type: application/json' -H 'Authorization: Bearer sk-check' -d "$body")" \
    '^200 .*data: \[DONE\]'
listed=$(http "$port" /sessions -H "Authorization: Bearer $TOKEN")
expect "the session is listed with the admin token" "$listed" "^200 .*$SESSION"
# A named session is kept under its id scoped by the client's credential: the row's "key".
key=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1].split(" ", 1)[1])[0]["key"])' "$listed" 2>/dev/null)
sql="import sqlite3; print(sqlite3.connect('file:/data/journals.sqlite?mode=ro', uri=True).execute('select count(*) from sessions').fetchone()[0])"
rows=$($DOCKER exec "$RUN-proxy" python -c "$sql" 2>&1)
check "the SQLite state file on the /data volume holds the session ($rows row)" test "$rows" = 1

check "HEALTHCHECK reports healthy" bash -c "for i in \$(seq 90); do
    [ \"\$($DOCKER inspect -f '{{.State.Health.Status}}' $RUN-proxy)\" = healthy ] && exit 0; sleep 1; done; exit 1"
check "docker stop of serve is graceful (SIGTERM, exit code 0)" stops_cleanly proxy

serve_own_config proxy2
check "a new container on the same volume starts" wait_healthz proxy2
expect "the session survives in the volume's state file (GET /sessions/{key})" \
    "$(http "$(host_port proxy2)" "/sessions/$key" -H "Authorization: Bearer $TOKEN")" "^200 .*$SESSION"
check "docker stop of simulate is graceful (SIGTERM, exit code 0)" stops_cleanly sim

# --- the demo, inside the image, with no network at all -----------------------------------------------
if $DOCKER run --rm --network none "$TAG" context-proxy demo >"$WORK/demo.txt" 2>&1; then
    check "demo runs in the image (no network): no refused turn via the proxy" \
        grep -qE 'turns failed \(window\) +[0-9]+ +0$' "$WORK/demo.txt"
else
    tail -20 "$WORK/demo.txt"
    fail "demo runs in the image (no network)"
fi
finish
