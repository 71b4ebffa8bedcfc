#!/usr/bin/env bash
# Installs the system packages ledgerlm's local services need, when missing:
# Java 17+ and Maven (Kafka 4 broker from Maven Central) and PostgreSQL (Debian package).
set -euo pipefail

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "ledgerlm: missing system packages: ${missing[*]} (install them with apt-get as root)" >&2
  exit 1
fi
echo "ledgerlm: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q "${missing[@]}"
