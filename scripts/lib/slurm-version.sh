# shellcheck shell=bash
# Every Slurm-version-specific choice of scripts/cluster lives here, in one place.
#
# The version is read from `slurmctld -V` ("slurm-wlm 22.05.8" on Debian). `sinfo --version`
# cannot be used before slurm.conf exists: the client refuses to start without a configuration
# ("Could not establish a configuration source"), whereas the daemons print the version
# without one. Debian 12 ships 22.05.8 (measured); Debian 13 ships 24.x (not measured).
#
# Sets:
#   SLURM_VERSION        e.g. 22.05.8
#   SLURM_VERSION_MM     e.g. 22.05   (major.minor)
#   SLURM_CONF_VERSIONED lines appended to slurm.conf for this version
#   SLURM_RESV_GPU_TRES  1 if reservations accept TRES=gres/gpu=N (22.05 rejects it)

slurm_version_detect() {
    local out
    out=$("${SLURM_SBIN:-/usr/sbin}/slurmctld" -V 2>/dev/null) || die "slurmctld -V failed (is slurmctld installed?)"
    SLURM_VERSION=${out##* }
    [[ $SLURM_VERSION =~ ^([0-9]+)\.([0-9]+) ]] || die "cannot parse Slurm version from '$out'"
    SLURM_VERSION_MM="${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    local major=$((10#${BASH_REMATCH[1]})) minor=$((10#${BASH_REMATCH[2]}))
    local num=$((major * 100 + minor))

    # Store the job's --comment in the accounting DB (the portal can tag jobs with it).
    # AccountingStoreFlags exists since 20.11.
    SLURM_CONF_VERSIONED="AccountingStoreFlags=job_comment"

    if ((num < 2305)); then
        # 22.05: GPU GRES without File= is dropped and the node drains, so gres.conf points at
        # fake character devices (made by scripts/cluster in any version; harmless later).
        # 22.05 rejects TRES=gres/gpu=N in reservations; only whole-node reservations work.
        SLURM_RESV_GPU_TRES=0
    else
        # Newer Slurm accepts GPU counts in reservations; measured on 25.11.7:
        # `scontrol create reservation ... tres=gres/gpu:a100=2` -> TRES=cpu=32,gres/gpu:a100=2.
        SLURM_RESV_GPU_TRES=1
    fi
    # Measured: 22.05 (Debian 12) and 25.11 (built from source by scripts/lib/slurm-build.sh);
    # the same slurm.conf/gres.conf/slurmdbd.conf templates run unchanged on both.
    if ((num < 2205)); then
        warn "Slurm $SLURM_VERSION is older than 22.05, the oldest version this script was tested with"
    elif ((num != 2205 && num != 2511)); then
        warn "Slurm $SLURM_VERSION: only 22.05 and 25.11 were measured; re-check scripts/lib/slurm-version.sh"
    fi
}
