#!/usr/bin/env bash
# Installs what the sandboxed autograde (python -m tools.autograde, tests/test_autograde.py)
# needs, only where it is missing: Debian's bubblewrap. Idempotent: a second run changes
# nothing. Without root or apt-get it says what to install and exits 1. It then checks that
# bubblewrap can create its namespaces here (root, or unprivileged user namespaces), and says
# (without failing) whether an ordinary user may create them too (tests/test_autograde.py
# grades as one when run as root) and whether a memory cgroup bounds each sandbox.
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

# The namespaces the autograde asks for, a user namespace included even as root (each sandbox
# gets its own keyrings through it).
NS=(--unshare-ipc --unshare-pid --unshare-net --unshare-uts --unshare-user --die-with-parent)
if bwrap "${NS[@]}" --ro-bind / / true 2>/tmp/bwrap-check.$$; then
  echo "sandbox: bubblewrap creates its namespaces here"
else
  echo "sandbox: bubblewrap is installed but cannot create its namespaces: $(tail -1 /tmp/bwrap-check.$$)" >&2
  echo "sandbox: allow user namespaces (user.max_user_namespaces above 0; as an ordinary user also" \
       "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also" \
       "kernel.apparmor_restrict_unprivileged_userns=0)." >&2
  rm -f /tmp/bwrap-check.$$
  exit 1
fi
rm -f /tmp/bwrap-check.$$

# As an ordinary user (a uid without a passwd entry, as tests/test_autograde.py uses)
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
  if setpriv --reuid=47113 --regid=47113 --clear-groups -- \
       bwrap --unshare-user --unshare-pid --unshare-net --ro-bind / / true 2>/dev/null; then
    echo "sandbox: an ordinary user can create the namespaces too (the unprivileged tests run)"
  else
    echo "sandbox: an ordinary user cannot create user namespaces here: the unprivileged tests are skipped"
  fi
fi
# The memory cgroup (root: cgroup v2, or v1's memory controller, writable)
if { [ -f /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control \
     && [ -w /sys/fs/cgroup ]; } || [ -w /sys/fs/cgroup/memory ]; then
  echo "sandbox: each sandbox gets a memory cgroup"
else
  echo "sandbox: no writable memory cgroup: memory is bounded per process only (README: what the sandbox does not do)"
fi
