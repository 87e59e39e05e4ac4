#!/usr/bin/env bash
# `make test`: installs what is missing, then runs every suite to its end,
# whatever an earlier one did, so one failure hides nothing. Prints each
# phase's result and time, and fails at the end if any phase failed.
#   scripts/test-suites.sh               everything
#   scripts/test-suites.sh python web    only the suites named (setup first)
# A failed setup phase (the installs, the llama-server build) stops the run:
# every suite after it would fail for the same reason.
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}

setup=(install llama-server)
suites=(lint rust python web)
# What each phase runs: Makefile targets, so each can be run alone.
declare -A targets=(
  [install]="deps test-models .venv/.installed browser-deps agent-deps mcp-deps code-deps lb-deps"
  [llama-server]="llama-server"
  [lint]="lint"
  [rust]="test-rust"
  [python]="test-python"
  [web]="test-web"
)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${suites[@]}")
for name in "${wanted[@]}"; do
  [ -n "${targets[$name]+set}" ] || { echo "no suite '$name': the suites are ${suites[*]}" >&2; exit 2; }
done

summary=()
failed=0
started=$SECONDS

phase() {
  local name=$1 begun=$SECONDS status
  echo "==> $name: $make ${targets[$name]}"
  # shellcheck disable=SC2086 # the targets are words
  if $make --no-print-directory ${targets[$name]}; then status=passed; else status=FAILED; failed=1; fi
  summary+=("$(printf '%-13s %-7s %6ss' "$name" "$status" $((SECONDS - begun)))")
  echo "==> $name: $status in $((SECONDS - begun))s"
  [ "$status" = passed ]
}

report() {
  echo
  echo "make test: each phase"
  printf '%s\n' "${summary[@]}"
  printf '%-13s %-7s %6ss\n' total "$([ $failed = 0 ] && echo passed || echo FAILED)" $((SECONDS - started))
  local passed failed_count
  passed=$(printf '%s\n' "${summary[@]}" | grep -c ' passed ')
  failed_count=$(printf '%s\n' "${summary[@]}" | grep -c ' FAILED ')
  echo "phases: $passed passed, $failed_count failed"
}

for name in "${setup[@]}"; do
  phase "$name" || { report; exit 1; }
done
for name in "${wanted[@]}"; do
  phase "$name"
done
report
exit $failed
