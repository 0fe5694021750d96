#!/usr/bin/env bash
# System packages the test suite uses, from Debian: PostgreSQL for the tracking-server tests,
# Chromium and ChromeDriver for the MLflow UI tests, OSMesa (libosmesa6) for MuJoCo's offscreen
# camera rendering on the CPU (data.cameras, the vision policy, visual scenario families). Installed with apt-get when missing and
# running as root; otherwise those tests skip with a message (VLAEVAL_REQUIRE_SYSTEM_PACKAGES=1,
# set by .ci/run, turns the skip into a failure).
set -uo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing+=(postgresql)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
ldconfig -p 2>/dev/null | grep -q 'libOSMesa\.so' || missing+=(libosmesa6)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "note: ${missing[*]} not installed and not root: the tests that need it will skip" >&2
    exit 0
fi
echo "installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || echo "warning: apt-get could not install ${missing[*]}" >&2
