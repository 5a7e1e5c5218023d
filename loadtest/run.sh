#!/usr/bin/env bash
# The whole benchmark in one command, on a fresh Debian machine:
#   loadtest/run.sh                      # full scale, every target and workload
#   loadtest/run.sh --scale quick        # any `python -m loadtest run` option
# Installs what the benchmark needs but Hoard does not (nginx, wrk, iproute2,
# matplotlib) when it is missing, then runs. Results: loadtest/results/.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
python3 -c 'import moto.server, boto3, yaml, diskcache, matplotlib' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'

exec python3 -m loadtest run --scale full "$@"
