#!/usr/bin/env bash
# make image-test: build the CPU image (deploy/Dockerfile) and check a running container.
#
#  1. apt-get installs docker.io and debootstrap when they are missing (needs root).
#  2. Uses the Docker engine that answers, or starts dockerd in the background (and stops
#     it at the end); if dockerd cannot set up its bridge, it retries without iptables and
#     the bridge, and containers use the host's network.
#  3. A Debian bookworm base (debootstrap minbase with python3-minimal, python3-venv,
#     python3-pip), cached as a tarball under .cache/image-test/ (git-ignored) and imported
#     as a local image, plus the host's CA bundle (so pip works behind a TLS-intercepting
#     proxy, as on CI machines). No registry is needed.
#  4. docker build --build-arg BASE_IMAGE=<that base> -f deploy/Dockerfile .
#  5. deploy/drive_container.py runs the image (twice: plain, and hardened like the
#     Kubernetes manifests) and drives it from the host with the SDK; see its docstring.
#
# Containers and volumes it made are removed on exit, whatever happens; the images stay
# (a second run reuses Docker's layer cache). Environment:
#   PY                        python with the SDK (default .venv/bin/python)
#   IMAGE_TEST_CACHE          cache folder (default .cache/image-test)
#   IMAGE_TEST_NETWORK        bridge|host (default: bridge unless dockerd needed the fallback)
#   IMAGE_TEST_DOCKERD_FLAGS  extra dockerd flags, when this script starts it
#   DEBIAN_MIRROR             debootstrap's mirror (default http://deb.debian.org/debian)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
CACHE=${IMAGE_TEST_CACHE:-$ROOT/.cache/image-test}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_TAR=$CACHE/debian-$SUITE-minbase-python3.tar.gz
IMAGE=${IMAGE_TEST_IMAGE:-sparseserve:image-test}
NETWORK=${IMAGE_TEST_NETWORK:-bridge}
RUN_ID=$$-$RANDOM
export IMAGE_TEST_RUN_ID=$RUN_ID
mkdir -p "$CACHE"

DOCKERD_PID=
ROOTFS=
CA_CONTEXT=
TIMINGS=()
phase_start() { PHASE=$1; PHASE_T0=$EPOCHREALTIME; echo "==> $PHASE" >&2; }
phase_end() {
    local took
    took=$(awk -v a="$PHASE_T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    TIMINGS+=("$(printf '%-34s %7s s%s' "$PHASE" "$took" "${1:+  ($1)}")")
}
die() { echo "image-test: $*" >&2; exit 1; }
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"
    else die "needs root for: $* (run as root, or install docker.io and debootstrap yourself)"; fi
}

cleanup() {
    local rc=$?
    set +e
    if docker info >/dev/null 2>&1; then
        docker ps -aq --filter "label=sparseserve.image-test=$RUN_ID" | xargs -r docker rm -f -v >/dev/null
        docker volume ls -q --filter "label=sparseserve.image-test=$RUN_ID" | xargs -r docker volume rm -f >/dev/null
        docker network ls -q --filter "label=sparseserve.image-test=$RUN_ID" | xargs -r docker network rm >/dev/null
    fi
    [ -n "$ROOTFS" ] && rm -rf "$ROOTFS"
    [ -n "$CA_CONTEXT" ] && rm -rf "$CA_CONTEXT"
    if [ -n "$DOCKERD_PID" ]; then
        echo "==> stopping the dockerd this script started (pid $DOCKERD_PID)" >&2
        kill -TERM "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 1 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$DOCKERD_PID" 2>/dev/null
    fi
    if [ ${#TIMINGS[@]} -gt 0 ]; then
        echo "==> image-test timings" >&2
        printf '    %s\n' "${TIMINGS[@]}" >&2
    fi
    [ $rc = 0 ] && echo "image-test: PASSED" >&2 || echo "image-test: FAILED (exit $rc)" >&2
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$PY" ] || die "$PY not found: run it through 'make image-test' (it makes .venv first)"

# ---------------------------------------------------------------- 1. packages
phase_start "apt-get install"
engine_up() { docker info >/dev/null 2>&1; }
need=()
if ! command -v docker >/dev/null || { ! engine_up && ! command -v dockerd >/dev/null; }; then need+=(docker.io); fi
if [ ! -s "$BASE_TAR" ] && ! command -v debootstrap >/dev/null; then need+=(debootstrap); fi
if [ ${#need[@]} -gt 0 ]; then
    # Other sources in sources.list may be unreachable; only Debian's are needed.
    as_root apt-get update -qq || echo "apt-get update reported errors; trying the install anyway" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
        >"$CACHE/apt.log" 2>&1 || { tail -n 30 "$CACHE/apt.log" >&2; die "apt-get install ${need[*]} failed"; }
    phase_end "installed ${need[*]}"
else
    phase_end "nothing to install"
fi

# ---------------------------------------------------------------- 2. engine
phase_start "docker engine"
start_dockerd() {
    # No systemd here: dockerd in the background, its log under the cache folder.
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo -n)
    "${sudo[@]}" dockerd "$@" ${IMAGE_TEST_DOCKERD_FLAGS:-} >"$CACHE/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 1 120); do
        engine_up && return 0
        kill -0 "$DOCKERD_PID" 2>/dev/null || break
        sleep 0.5
    done
    echo "dockerd $* did not answer within 60 s; the end of its log:" >&2
    tail -n 25 "$CACHE/dockerd.log" >&2
    kill -TERM "$DOCKERD_PID" 2>/dev/null; wait "$DOCKERD_PID" 2>/dev/null || true
    DOCKERD_PID=
    return 1
}
if engine_up; then
    phase_end "an engine was already running: $(docker version -f '{{.Server.Version}}')"
else
    if start_dockerd; then
        phase_end "started dockerd $(docker version -f '{{.Server.Version}}')"
    else
        echo "retrying with --iptables=false --bridge=none (containers on the host network)" >&2
        start_dockerd --iptables=false --bridge=none || die "dockerd would not start (see $CACHE/dockerd.log)"
        NETWORK=host
        phase_end "started dockerd without a bridge"
    fi
fi
docker info --format '    storage driver {{.Driver}}, cgroup {{.CgroupVersion}}, {{.NCPU}} CPUs' >&2 || true

# ---------------------------------------------------------------- 3. base image
phase_start "debootstrap $SUITE"
if [ -s "$BASE_TAR" ]; then
    phase_end "cached: $(basename "$BASE_TAR")"
else
    ROOTFS=$CACHE/rootfs.$RUN_ID
    as_root debootstrap --variant=minbase --include=python3-minimal,python3-venv,python3-pip \
        "$SUITE" "$ROOTFS" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -n 30 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
    as_root rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    as_root tar --numeric-owner -C "$ROOTFS" -cf - . | gzip -1 >"$BASE_TAR.tmp"
    mv "$BASE_TAR.tmp" "$BASE_TAR"
    as_root rm -rf "$ROOTFS"
    ROOTFS=
    phase_end "$(du -h "$BASE_TAR" | cut -f1) tarball"
fi

phase_start "base image"
host_ca=/etc/ssl/certs/ca-certificates.crt
tar_sum=$(sha256sum "$BASE_TAR" | cut -c1-12)
ca_sum=$( [ -f "$host_ca" ] && sha256sum "$host_ca" | cut -c1-12 || echo none)
BASE_RAW=sparseserve-image-test-base:$SUITE-$tar_sum
BASE=sparseserve-image-test-base:$SUITE-$tar_sum-ca-$ca_sum
if docker image inspect "$BASE" >/dev/null 2>&1; then
    phase_end "present: $BASE"
else
    docker image inspect "$BASE_RAW" >/dev/null 2>&1 || docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
        "$BASE_TAR" "$BASE_RAW" >/dev/null
    CA_CONTEXT=$(mktemp -d)
    if [ -f "$host_ca" ]; then
        cp "$host_ca" "$CA_CONTEXT/ca-certificates.crt"
        printf 'FROM %s\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n' "$BASE_RAW" >"$CA_CONTEXT/Dockerfile"
    else
        printf 'FROM %s\n' "$BASE_RAW" >"$CA_CONTEXT/Dockerfile"
    fi
    DOCKER_BUILDKIT=0 docker build -q -t "$BASE" "$CA_CONTEXT" >"$CACHE/base-build.log" 2>&1 \
        || { cat "$CACHE/base-build.log" >&2; die "adding the CA bundle to the base failed"; }
    phase_end "imported $BASE"
fi

# ---------------------------------------------------------------- 4. build
phase_start "docker build"
build_log=$CACHE/build.log
network_flag=()
[ "$NETWORK" = host ] && network_flag=(--network host)
# Each line of the build's output with the time it arrived, to time the warm-up step.
set +e
DOCKER_BUILDKIT=0 docker build --force-rm "${network_flag[@]}" --build-arg "BASE_IMAGE=$BASE" \
    -f deploy/Dockerfile -t "$IMAGE" . 2>&1 \
    | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done \
    | tee "$build_log" | cut -d' ' -f2- | grep -E --line-buffered '^(Step |Successfully|The command|ERROR|error)' >&2
build_rc=${PIPESTATUS[0]}
set -e
if [ "$build_rc" != 0 ]; then
    tail -n 40 "$build_log" | cut -d' ' -f2- >&2
    die "docker build failed (full log: $build_log)"
fi
warm=$(awk '/ Step [0-9]+\/[0-9]+ : / { if (w) { d = $1 - t; w = 0; found = 1 }
                                         if (/kernels\.warm_up/) { t = $1; w = 1 }; next }
            / ---> Using cache/ { if (w) cached = 1 }
            END { if (cached) print "cached"; else if (found) printf "%.1f s", d; else print "?" }' "$build_log")
phase_end "of which the kernel warm-up (numba compile) $warm; image $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

# ---------------------------------------------------------------- 5. run and drive
phase_start "run and drive the container"
"$PY" "$ROOT/deploy/drive_container.py" "$IMAGE" --network "$NETWORK" || die "the container checks failed"
phase_end
