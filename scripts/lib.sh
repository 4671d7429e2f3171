# Shared by scripts/install_*.sh (sourced): is this CI, and apt-get with retries.
in_ci() { case "${CI:-}" in 1 | true | TRUE | True | yes) return 0 ;; *) return 1 ;; esac; }

apt_retry() {
    local try
    for try in 1 2 3; do
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3 "$@" && return 0
        echo "apt-get $* failed (try $try of 3); retrying in $((try * 10)) s" >&2
        sleep $((try * 10))
    done
    return 1
}

# Install Debian's package $1 where this is root with apt-get; else say how, for $2 (what needs it, e.g. "the browser
# tests"): an error under CI=true, where those must run, and a note elsewhere, where they are skipped (exit 0).
apt_install_or_skip() {
    local package="$1" needs="$2"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's $package for $needs (apt-get)"
        apt_retry update -qq && apt_retry install -y -qq "$package" && return 0
        echo "could not install $package with apt-get; $needs need it" >&2
        exit 1
    fi
    local msg="$package is missing: install it (sudo apt-get install $package) for $needs"
    if in_ci; then
        echo "$msg (CI=true: they must run)" >&2
        exit 1
    fi
    echo "$msg; until then they are skipped"
    exit 0
}
