# shellcheck shell=bash
# Build Slurm from a source tarball into a prefix of its own (used by scripts/cluster --slurm
# and scripts/pyslurm). Source, do not run; needs lib/common.sh first.
#
#   SLURM_SOURCE  the tarball  [<repo>/../shared/vendor/slurm-25.11.7.tar.gz]
#                 its sha256 is checked against SLURM_SOURCE.sha256 when that file exists
#
# The prefix is /opt/gpuportal-slurm-<version>-<12 hex of sha256(tarball's sha256, configure
# flags, the patches' sha256)>: a new tarball (or new flags, or a new patch) builds into a new prefix, the same is built once (the stamp file
# .gpuportal-built in the prefix is written last, after `make install` into a staging dir
# was moved into place, so an interrupted build never looks finished).
#
# Sets: SLURM_SOURCE SLURM_SRC_SHA SLURM_SRC_VERSION SLURM_PREFIX SLURM_PATCHES (an array)

SLURM_BUILD_DEPS=(build-essential patch pkg-config libmunge-dev libmariadb-dev libjson-c-dev libyaml-dev
    libhttp-parser-dev libjwt-dev libcurl4-openssl-dev libdbus-1-dev liblz4-dev libpam0g-dev munge)
# --enable-multiple-slurmd: several slurmd on one host (the emulated nodes), as Debian builds it.
# Without it 25.11 logs "Duplicated NodeHostName" and, once slurmctld restarts, cannot address any
# node but the first ("_fwd_tree_get_addr: can't find address for host a100-02"): they stay idle*.
SLURM_CONFIGURE_FLAGS=(--with-munge --enable-multiple-slurmd --disable-debug --without-hdf5 --without-rrdtool
    --without-pmix --without-ucx)
# Patches for the release, applied in name order (-p1): slurm-patches/<major.minor>-*.patch. Each
# file says what it fixes and how it was measured; today only 25.11-rollup-wakeup.patch (slurmdbd
# skipped its hourly roll-up when it woke within a tick of the hour).
SLURM_PATCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/slurm-patches
slurm_patches() { compgen -G "$SLURM_PATCH_DIR/$1-*.patch" | sort; }

# slurm_source_locate WANT_MM: find and check the tarball for Slurm WANT_MM (e.g. 25.11).
# Exit status 4 (and a message naming SLURM_SOURCE) when it is missing.
slurm_source_locate() {
    local want=$1 repo sumfile expected
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    SLURM_SOURCE=${SLURM_SOURCE:-$repo/../shared/vendor/slurm-25.11.7.tar.gz}
    if [[ ! -r $SLURM_SOURCE ]]; then
        warn "no Slurm $want source tarball at SLURM_SOURCE=$SLURM_SOURCE"
        warn "set SLURM_SOURCE to a slurm-$want.x.tar.gz (SchedMD's release source) to build it"
        return 4
    fi
    SLURM_SOURCE=$(readlink -f "$SLURM_SOURCE")
    SLURM_SRC_SHA=$(sha256sum "$SLURM_SOURCE" | cut -d' ' -f1)
    sumfile=$SLURM_SOURCE.sha256
    if [[ -r $sumfile ]]; then
        expected=$(cut -d' ' -f1 <"$sumfile")
        [[ $expected == "$SLURM_SRC_SHA" ]] \
            || die "SLURM_SOURCE=$SLURM_SOURCE: sha256 $SLURM_SRC_SHA, but $sumfile says $expected"
    else
        warn "no $sumfile: building SLURM_SOURCE=$SLURM_SOURCE unchecked (sha256 $SLURM_SRC_SHA)"
    fi
    # The version from the tarball's META file (Version/Micro), not from its file name.
    local meta major minor micro
    meta=$(tar -xzOf "$SLURM_SOURCE" --wildcards --no-anchored '*/META' 2>/dev/null | head -n 40) \
        || die "SLURM_SOURCE=$SLURM_SOURCE: no META file (not a Slurm source tarball?)"
    major=$(awk '$1 == "Major:" {print $2; exit}' <<<"$meta")
    minor=$(awk '$1 == "Minor:" {print $2; exit}' <<<"$meta")
    micro=$(awk '$1 == "Micro:" {print $2; exit}' <<<"$meta")
    [[ -n $major && -n $minor && -n $micro ]] || die "SLURM_SOURCE=$SLURM_SOURCE: cannot read its version from META"
    SLURM_SRC_VERSION=$major.$minor.$micro
    [[ $major.$minor == "$want" ]] \
        || die "SLURM_SOURCE=$SLURM_SOURCE is Slurm $SLURM_SRC_VERSION, not $want"
    local key patches=""
    mapfile -t SLURM_PATCHES < <(slurm_patches "$major.$minor")
    ((${#SLURM_PATCHES[@]} == 0)) || patches=$(sha256sum "${SLURM_PATCHES[@]}" | cut -d' ' -f1 | tr '\n' ' ')
    key=$(printf '%s %s%s' "$SLURM_SRC_SHA" "${SLURM_CONFIGURE_FLAGS[*]}" "${patches:+ $patches}" | sha256sum | cut -c1-12)
    SLURM_PREFIX=/opt/gpuportal-slurm-$SLURM_SRC_VERSION-$key
}

slurm_built() { [[ $(cat "$SLURM_PREFIX/.gpuportal-built" 2>/dev/null) == "$SLURM_SRC_SHA" ]]; }

# slurm_build: build and install into SLURM_PREFIX unless already done (call after _locate).
# One build at a time per machine: a second caller (another checkout's `make test`, CI) waits for the
# first and then finds its result instead of building the same prefix again beside it.
slurm_build_lock() {
    mkdir -p /opt
    exec {SLURM_BUILD_LOCK_FD}>/opt/.gpuportal-slurm-build.lock
    if ! flock -n "$SLURM_BUILD_LOCK_FD"; then
        log "another Slurm/pyslurm build is running on this machine: waiting for it"
        flock "$SLURM_BUILD_LOCK_FD"
    fi
}

# Close the lock's descriptor, so that daemons started afterwards do not inherit (and hold) it.
slurm_build_unlock() {
    [[ -n ${SLURM_BUILD_LOCK_FD:-} ]] || return 0
    exec {SLURM_BUILD_LOCK_FD}>&-
    SLURM_BUILD_LOCK_FD=
}

slurm_build() {
    slurm_built || slurm_build_lock
    if slurm_built; then
        slurm_build_unlock
        log "Slurm $SLURM_SRC_VERSION: built in $SLURM_PREFIX"
        return 0
    fi
    apt_ensure "${SLURM_BUILD_DEPS[@]}"
    local work t0=$SECONDS
    work=$(mktemp -d /tmp/gpuportal-slurm-build.XXXXXX)
    log "Slurm $SLURM_SRC_VERSION: building into $SLURM_PREFIX (log: $work/build.log; ~3.5 min on 2 cores)"
    (
        set -e
        cd "$work"
        tar -xzf "$SLURM_SOURCE"
        cd "$(find . -mindepth 1 -maxdepth 1 -type d | head -n1)"
        for p in "${SLURM_PATCHES[@]}"; do echo "applying $p"; patch -p1 --forward <"$p"; done
        ./configure --prefix="$SLURM_PREFIX" --sysconfdir="$SLURM_PREFIX/etc" "${SLURM_CONFIGURE_FLAGS[@]}"
        make -j"$(nproc)"
        make install DESTDIR="$work/stage"
    ) >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; die "Slurm build failed (log: $work/build.log)"; }
    rm -rf "$SLURM_PREFIX"
    mkdir -p "$(dirname "$SLURM_PREFIX")"
    mv "$work/stage$SLURM_PREFIX" "$SLURM_PREFIX"
    echo "$SLURM_SRC_SHA" >"$SLURM_PREFIX/.gpuportal-built"
    rm -rf "$work"
    slurm_build_unlock
    log "Slurm $SLURM_SRC_VERSION: built in $((SECONDS - t0)) s"
}
