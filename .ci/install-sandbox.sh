#!/usr/bin/env bash
# Installs what the sandboxed autograde (python -m utils.autograde, tests/test_autograde.py)
# needs, only where it is missing: Debian's bubblewrap. Idempotent: a second run changes
# nothing. Without root or apt-get it says what to install and exits 1. It then checks that
# bubblewrap can create its namespaces here (root, or unprivileged user namespaces).
set -euo pipefail

if command -v bwrap >/dev/null 2>&1; then
  echo "sandbox: $(bwrap --version) is installed"
else
  # root, or a user with password-less sudo (a GitHub runner) may install it
  SUDO=()
  if [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null; then SUDO=(sudo -n); fi
  if { [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; } || ! command -v apt-get >/dev/null 2>&1; then
    echo "sandbox: bubblewrap is missing and cannot be installed here (needs root or sudo, and apt-get)." >&2
    echo "sandbox: install Debian's bubblewrap package (apt-get install bubblewrap)." >&2
    exit 1
  fi
  echo "sandbox: installing Debian's bubblewrap ..."
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
  echo "sandbox: $(bwrap --version) installed"
fi

# The namespaces the autograde asks for; as root bubblewrap needs no user namespace.
NS=(--unshare-ipc --unshare-pid --unshare-net --unshare-uts --die-with-parent)
if [ "$(id -u)" -ne 0 ]; then NS+=(--unshare-user); fi
if bwrap "${NS[@]}" --ro-bind / / true 2>/tmp/bwrap-check.$$; then
  echo "sandbox: bubblewrap creates its namespaces here"
else
  echo "sandbox: bubblewrap is installed but cannot create its namespaces: $(tail -1 /tmp/bwrap-check.$$)" >&2
  echo "sandbox: run as root, or allow unprivileged user namespaces" \
       "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also" \
       "kernel.apparmor_restrict_unprivileged_userns=0)." >&2
  rm -f /tmp/bwrap-check.$$
  exit 1
fi
rm -f /tmp/bwrap-check.$$
