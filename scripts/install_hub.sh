#!/usr/bin/env bash
# JupyterHub's proxy for the hub test (tests/test_hub_workshop.py through tests/hub_testbed.py): jupyterhub itself
# comes from pip with the `test` extra; its proxy, configurable-http-proxy, is a node program from npm.
#
#   bash scripts/install_hub.sh    # what `make hub` runs
#
# Already there: says which version. Missing and root with apt-get: installs node and npm from Debian if they are
# missing (apt-get update first, retried, waiting for a held dpkg lock), then `npm install -g
# configurable-http-proxy`. Missing otherwise: says how to install it; that is an error under CI=true, where the
# hub test must run, and a note elsewhere, where it is skipped. The test makes two learner accounts (useradd, in
# Debian's passwd package, which every Debian system has) and lets them through folders closed to other users on
# the way to the Python it runs (a pyenv under /root) with one ACL entry each: setfacl, from Debian's acl package,
# installed here too.
set -uo pipefail

. "$(dirname "$0")/lib.sh"  # in_ci, apt_retry

npm_retry() {
    local try
    for try in 1 2 3; do
        npm "$@" && return 0
        echo "npm $* failed (try $try of 3); retrying in $((try * 10)) s" >&2
        sleep $((try * 10))
    done
    return 1
}

not_here() {
    local msg="$1 (the JupyterHub test needs it)"
    if in_ci; then
        echo "$msg; CI=true: the hub test must run" >&2
        exit 1
    fi
    echo "$msg; until then the hub test is skipped"
    exit 0
}

if ! command -v setfacl >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        not_here "setfacl is missing: install it with \`sudo apt-get install acl\`"
    fi
    echo "installing Debian's acl (setfacl) for the hub test (apt-get)"
    apt_retry update -qq && apt_retry install -y -qq acl || {
        echo "could not install acl with apt-get; the hub test needs setfacl" >&2
        exit 1
    }
fi

if ! command -v configurable-http-proxy >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        not_here "configurable-http-proxy is missing: install it with \`sudo npm install -g configurable-http-proxy\`"
    fi
    if ! command -v npm >/dev/null; then
        command -v apt-get >/dev/null || not_here "npm is missing and there is no apt-get to install it with"
        echo "installing Debian's nodejs and npm for JupyterHub's proxy (apt-get)"
        apt_retry update -qq && apt_retry install -y -qq nodejs npm || {
            echo "could not install nodejs and npm with apt-get; the hub test needs them" >&2
            exit 1
        }
    fi
    echo "installing configurable-http-proxy (npm install -g)"
    npm_retry install -g --no-fund --no-audit configurable-http-proxy || {
        echo "could not install configurable-http-proxy with npm; the hub test needs it" >&2
        exit 1
    }
    command -v configurable-http-proxy >/dev/null || {
        echo "npm installed configurable-http-proxy but it is not on PATH (npm prefix: $(npm config get prefix))" >&2
        exit 1
    }
fi
echo "JupyterHub proxy ready: configurable-http-proxy $(configurable-http-proxy --version 2>/dev/null | head -1)"
