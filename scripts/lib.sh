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
