#!/usr/bin/env bash
# Installs stripe-mock (Stripe's own mock of its API, validating every request against Stripe's OpenAPI
# spec) into <home>/bin for the export tests; needs Go. Usage: stripe-mock.sh BIN_DIR
set -euo pipefail

bin_dir="${1:?usage: stripe-mock.sh BIN_DIR}"
version="${STRIPE_MOCK_VERSION:-v0.203.0}"
if [ -x "$bin_dir/stripe-mock" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "ledgerlm: stripe-mock needs Go (https://go.dev/dl/) to build; install Go and run again" >&2
  exit 1
fi
mkdir -p "$bin_dir"
echo "ledgerlm: installing stripe-mock $version into $bin_dir" >&2
GOBIN="$(cd "$bin_dir" && pwd)" go install "github.com/stripe/stripe-mock@$version"
