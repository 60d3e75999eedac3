#!/usr/bin/env bash
# The Debian/Ubuntu packages the tests need, installed where missing and where this user can
# (root, or sudo: without a password, or asking for it on a terminal). scripts/check.sh runs
# it first, so the README's test command installs them on a fresh machine; .ci/run too.
#
#   postgresql  initdb, postgres, pgbench: the postgres target's tests and the PostgreSQL
#               storage backend's (conformance suite, replicas, bench.load)
#   chromium    the dashboard's browser test (tests/cli/test_dashboard.py) drives it headless
#   openssl     the TLS tests make a throwaway certificate with it (tests/server/test_security.py)
#
# Where one cannot be installed, its tests are skipped and the test run ends with one line
# naming them and the command that installs them (tests/conftest.py). SKIP_SYSTEM_PACKAGES=1
# installs nothing. Run inside the project's virtual environment (PostgreSQL is looked up
# the way the tests look it up, targets.db.postgres.tools.find_tools).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

missing=()
if ! python -c 'from targets.db.postgres.tools import find_tools; find_tools()' 2>/dev/null; then
    missing+=(postgresql)
fi
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    missing+=(chromium)
fi
if ! command -v openssl >/dev/null; then
    missing+=(openssl)
fi
[ "${#missing[@]}" -eq 0 ] && exit 0

say() { echo "system packages: $*" >&2; }
if [ "${SKIP_SYSTEM_PACKAGES:-0}" = 1 ]; then
    say "${missing[*]} missing; not installing them (SKIP_SYSTEM_PACKAGES=1)"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "${missing[*]} missing and this is not Debian/Ubuntu (no apt-get): install them yourself"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
    as_root=(sudo)
else
    say "${missing[*]} missing and this user cannot install them (not root, no sudo)"
    exit 0
fi
say "installing ${missing[*]} for the tests (${as_root[*]:+sudo }apt-get install)"
"${as_root[@]}" apt-get update -q || say "apt-get update failed; trying the install anyway"
packages=()
for name in "${missing[@]}"; do
    # Ubuntu has no 'chromium' package: its 'chromium-browser' (a snap on 20.04 and later)
    if [ "$name" = chromium ] && ! apt-cache show chromium >/dev/null 2>&1; then
        name=chromium-browser
    fi
    packages+=("$name")
done
if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"; then
    say "could not install ${packages[*]}: their tests will be skipped"
fi
exit 0
