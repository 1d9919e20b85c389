# shellcheck shell=bash
# Build the Kubernetes control plane (kube-apiserver, kube-scheduler, kube-controller-manager) from
# Debian 12's own `kubernetes` source package into a prefix of its own (used by scripts/k8s).
# Source, do not run; needs lib/common.sh first.
#
# Why from source: no registry reachable from here ships the daemons as binaries (Debian 12 builds
# only kubectl from this package); the source package is the complete upstream 1.20.2 tree with its
# vendor/ directory, and Debian's golang-go (1.19) builds it with the tree's own make rules (a plain
# `go build` does not: the generated OpenAPI file comes from those rules).
#
#   K8S_DEB_VERSION  the source package's version   [1.20.5+really1.20.2-1.1+deb12u1]
#   K8S_SRC_CACHE    where `apt-get source --download-only` keeps it  [/var/cache/gpuportal-k8s-src]
#
# The prefix is /opt/gpuportal-k8s-<upstream version>-<12 hex of sha256(the .dsc's sha256, the Go
# version, the make targets, the patches' sha256)>: a new package, toolchain or patch builds into a
# new prefix, the same is built once. The stamp .gpuportal-built is written last, after the binaries
# were moved into place, so an interrupted build never looks finished.
#
# Sets: K8S_DSC K8S_SRC_SHA K8S_VERSION K8S_PREFIX K8S_PATCHES (an array)

K8S_DEB_VERSION=${K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
K8S_SRC_CACHE=${K8S_SRC_CACHE:-/var/cache/gpuportal-k8s-src}
K8S_BUILD_DEPS=(build-essential rsync golang-go dpkg-dev etcd-server openssl curl)  # curl: scripts/k8s asks the daemons whether they answer
K8S_WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager"
K8S_BINARIES=(kube-apiserver kube-scheduler kube-controller-manager)
# Patches applied in name order (-p1) after Debian's own: k8s-patches/<major.minor>-*.patch. Each
# says what it fixes; today only 1.20-reflect2-go118-mapiterinit.patch (the API server's SIGSEGV
# under Go >= 1.18).
K8S_PATCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/k8s-patches
K8S_APT_SOURCES=/etc/apt/sources.list.d/gpuportal-bookworm-src.sources

# k8s_deb_src: a deb-src entry for bookworm (and its security suite, where deb12u1 comes from).
k8s_deb_src() {
    [[ -r $K8S_APT_SOURCES ]] && return 0
    log "adding deb-src lines for bookworm ($K8S_APT_SOURCES)"
    cat >"$K8S_APT_SOURCES" <<'EOF'
# Added by gpuportal's scripts/lib/k8s-build.sh: Debian 12's kubernetes source package (the control plane is built from it).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || die "apt-get update failed"
}

# k8s_source_locate: download (once) and identify the source package; set K8S_PREFIX.
k8s_source_locate() {
    local upstream=${K8S_DEB_VERSION#*really}
    upstream=${upstream%%-*}
    K8S_VERSION=$upstream
    K8S_DSC=$K8S_SRC_CACHE/kubernetes_${K8S_DEB_VERSION}.dsc
    if [[ ! -r $K8S_DSC ]]; then
        k8s_deb_src
        mkdir -p "$K8S_SRC_CACHE"
        log "downloading Debian's kubernetes $K8S_DEB_VERSION source package into $K8S_SRC_CACHE (~34 MB)"
        (cd "$K8S_SRC_CACHE" && apt-get source --download-only -qq "kubernetes=$K8S_DEB_VERSION" >&2) \
            || die "apt-get source kubernetes=$K8S_DEB_VERSION failed (is a bookworm deb-src line in $K8S_APT_SOURCES?)"
    fi
    K8S_SRC_SHA=$(sha256sum "$K8S_DSC" | cut -d' ' -f1)
    mapfile -t K8S_PATCHES < <(compgen -G "$K8S_PATCH_DIR/${upstream%.*}-*.patch" | sort)
    local patches="" gover
    ((${#K8S_PATCHES[@]} == 0)) || patches=$(sha256sum "${K8S_PATCHES[@]}" | cut -d' ' -f1 | tr '\n' ' ')
    gover=$(go version 2>/dev/null | awk '{print $3}')
    K8S_PREFIX=/opt/gpuportal-k8s-$upstream-$(printf '%s %s %s %s' "$K8S_SRC_SHA" "${gover:-nogo}" "$K8S_WHAT" "$patches" \
        | sha256sum | cut -c1-12)
}

k8s_built() { [[ $(cat "$K8S_PREFIX/.gpuportal-built" 2>/dev/null) == "$K8S_SRC_SHA" ]]; }

k8s_build_lock() {
    mkdir -p /opt
    exec {K8S_BUILD_LOCK_FD}>/opt/.gpuportal-k8s-build.lock
    if ! flock -n "$K8S_BUILD_LOCK_FD"; then
        log "another Kubernetes build is running on this machine: waiting for it"
        flock "$K8S_BUILD_LOCK_FD"
    fi
}

k8s_build_unlock() {
    [[ -n ${K8S_BUILD_LOCK_FD:-} ]] || return 0
    exec {K8S_BUILD_LOCK_FD}>&-
    K8S_BUILD_LOCK_FD=
}

# k8s_build: build into K8S_PREFIX unless already done. Go must be installed before _locate keys the
# prefix by its version, so this installs the dependencies and locates again.
k8s_build() {
    apt_ensure "${K8S_BUILD_DEPS[@]}"
    k8s_source_locate
    k8s_built || k8s_build_lock
    if k8s_built; then
        k8s_build_unlock
        log "Kubernetes $K8S_VERSION: built in $K8S_PREFIX"
        return 0
    fi
    local work t0=$SECONDS
    work=$(mktemp -d /var/tmp/gpuportal-k8s-build.XXXXXX)
    log "Kubernetes $K8S_VERSION: building into $K8S_PREFIX (log: $work/build.log; ~7 min on 2 cores)"
    (
        set -e
        cd "$work"
        dpkg-source -x "$K8S_DSC" src
        cd src
        for p in "${K8S_PATCHES[@]}"; do echo "applying $p"; patch -p1 --forward <"$p"; done
        # The tree's make rules (hack/make-rules/build.sh) generate the OpenAPI file, then go install
        # with -mod=vendor. Low priority: the machine is shared with the portal's tests.
        nice -n 10 make WHAT="$K8S_WHAT"
        mkdir -p "$work/stage/bin"
        for b in "${K8S_BINARIES[@]}"; do cp "_output/bin/$b" "$work/stage/bin/"; done
    ) >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; die "Kubernetes build failed (log: $work/build.log)"; }
    rm -rf "$K8S_PREFIX"
    mv "$work/stage" "$K8S_PREFIX"
    printf '%s\n' "$K8S_DEB_VERSION" >"$K8S_PREFIX/.deb-version"
    echo "$K8S_SRC_SHA" >"$K8S_PREFIX/.gpuportal-built"
    rm -rf "$work"
    k8s_build_unlock
    log "Kubernetes $K8S_VERSION: built in $((SECONDS - t0)) s"
}
