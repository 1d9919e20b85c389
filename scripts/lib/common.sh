# shellcheck shell=bash
# Helpers shared by scripts/cluster and scripts/services. Source, do not run.
#
# Rules these helpers enforce:
#   * packages are installed only when missing (one `apt-get update` per run);
#   * a daemon is stopped only through a pid file this project wrote, and only if the
#     process behind that pid still has the expected command name (pids get reused).

log()  { printf '%s %s\n' "[$(date +%H:%M:%S)]" "$*" >&2; }
warn() { printf '%s WARNING: %s\n' "[$(date +%H:%M:%S)]" "$*" >&2; }
die()  { printf '%s ERROR: %s\n' "[$(date +%H:%M:%S)]" "$*" >&2; exit 1; }

require_root() {
    [[ $(id -u) -eq 0 ]] || die "$(basename "$0") must run as root (it starts system daemons)"
}

# --- packages -------------------------------------------------------------------------

_APT_UPDATED=0

pkg_installed() {
    [[ $(dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# apt_ensure PKG...: install the packages that are not installed yet.
apt_ensure() {
    local missing=() p
    for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    log "installing missing packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ((!_APT_UPDATED)); then
        apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || die "apt-get update failed"
        _APT_UPDATED=1
    fi
    # Without systemd the maintainer scripts' invoke-rc.d exits 101 ("not allowed to
    # start"); that is harmless, we start the daemons ourselves.
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}

# --- processes --------------------------------------------------------------------------

# pid_from_file FILE: print the pid stored in FILE (nothing if absent/garbage).
pid_from_file() {
    local f=$1 pid
    [[ -r $f ]] || return 1
    read -r pid <"$f" || true
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    printf '%s\n' "$pid"
}

# pid_alive PID COMM: the process exists and its command name is COMM.
pid_alive() {
    local pid=$1 comm=$2 actual
    [[ -n $pid && -r /proc/$pid/comm ]] || return 1
    read -r actual <"/proc/$pid/comm" 2>/dev/null || return 1
    [[ $actual == "$comm" ]]
}

# pidfile_alive FILE COMM: FILE holds the pid of a running COMM.
pidfile_alive() {
    local pid
    pid=$(pid_from_file "$1") || return 1
    pid_alive "$pid" "$2"
}

# stop_pidfile NAME FILE COMM [TIMEOUT]: SIGTERM the process in FILE (if it is COMM), wait
# for it to exit (bounded), SIGKILL as a last resort, then remove FILE.
stop_pidfile() {
    local name=$1 file=$2 comm=$3 timeout=${4:-20} pid i
    if ! pid=$(pid_from_file "$file"); then
        return 0
    fi
    if ! pid_alive "$pid" "$comm"; then
        log "$name: not running (stale pid file $file)"
        rm -f "$file"
        return 0
    fi
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
        pid_alive "$pid" "$comm" || { rm -f "$file"; return 0; }
        sleep 0.1
    done
    warn "$name (pid $pid) did not exit within ${timeout}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
    rm -f "$file"
}

# wait_until SECONDS DESCRIPTION CMD...: poll CMD every 0.2 s until it succeeds.
wait_until() {
    local timeout=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { warn "timed out after ${timeout}s waiting for $what"; return 1; }
        sleep 0.2
    done
}

# tcp_open HOST PORT: something accepts connections there (bash /dev/tcp, no tools needed).
tcp_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

# --- templates ----------------------------------------------------------------------------

# render_template SRC DST NAME=VALUE...: copy SRC to DST replacing every @NAME@ by VALUE.
# Values may span several lines. Fails if a placeholder is left unreplaced.
render_template() {
    local src=$1 dst=$2 text kv name value
    shift 2
    text=$(<"$src")
    for kv in "$@"; do
        name=${kv%%=*}
        value=${kv#*=}
        text=${text//@"$name"@/$value}
    done
    if [[ $text =~ @[A-Z_]+@ ]]; then
        die "render_template $src: unreplaced placeholder ${BASH_REMATCH[0]}"
    fi
    printf '%s\n' "$text" >"$dst.tmp.$$"
    mv -f "$dst.tmp.$$" "$dst"
}
