#!/usr/bin/env bash
# Installs what the browser test (tests/test_browser.py) needs, only where it is missing:
# Debian's Chromium (a browser download by Playwright does not work offline) and the
# Playwright Python package in the course's virtual environment. Idempotent: a second run
# changes nothing. Without root or apt-get it says what to install and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM=${COURSE_CHROMIUM:-/usr/bin/chromium}
VENV=${COURSE_VENV:-.venv}

if [ -x "$CHROMIUM" ] || command -v chromium >/dev/null 2>&1; then
  echo "browser: $("${CHROMIUM}" --version 2>/dev/null || chromium --version 2>/dev/null) is installed"
else
  # root, or a user with password-less sudo (a GitHub runner) may install it
  SUDO=()
  if [ "$(id -u)" -ne 0 ] && sudo -n true 2>/dev/null; then SUDO=(sudo -n); fi
  if { [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; } || ! command -v apt-get >/dev/null 2>&1; then
    echo "browser: Chromium is missing and cannot be installed here (needs root or sudo, and apt-get)." >&2
    echo "browser: install Debian's chromium package, or set COURSE_CHROMIUM to a Chromium binary." >&2
    exit 1
  fi
  echo "browser: installing Debian's chromium ..."
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
  echo "browser: $(chromium --version 2>/dev/null) installed"
fi

# Playwright drives the browser; requirements.txt lists it, this covers an older venv.
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import playwright.sync_api" 2>/dev/null; then
  echo "browser: installing the playwright package into $VENV ..."
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q playwright
fi
