#!/usr/bin/env bash
# The test suite on a busy machine, as CI may meet it right after other work: beside processes that keep
# cores busy, and with the whole suite (and every process it starts) held to one core. Run it after
# changing anything that starts processes (torchrun, gloo groups, Lightning DDP, torchmetrics sync) or
# waits on something: a race or a tight timeout shows here before it turns a landing red.
#
#   bash scripts/stress-suite.sh [pytest arguments]        e.g. bash scripts/stress-suite.sh -x tests/driver/test_torchrun.py
#
#   STRESS_MODES    which runs, in order (default "busy one-core"):
#                     busy      beside STRESS_SPINNERS busy-looping processes (default 1)
#                     one-core  under `taskset -c 0`
#   STRESS_ROUNDS   how many times to repeat them (default 1); the script stops at the first red run
#   PYTHON          the interpreter (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
modes=${STRESS_MODES:-busy one-core}
rounds=${STRESS_ROUNDS:-1}
spinners=${STRESS_SPINNERS:-1}

spinning=()
stop_spinning() {
  if [ ${#spinning[@]} -gt 0 ]; then kill "${spinning[@]}" 2>/dev/null || true; fi
  spinning=()
}
trap stop_spinning EXIT

for round in $(seq "$rounds"); do
  for mode in $modes; do
    start=$SECONDS
    case "$mode" in
      busy)
        for _ in $(seq "$spinners"); do "$python" -c "while True: pass" & spinning+=($!); done
        echo "stress-suite: round $round of $rounds, beside $spinners busy process(es)"
        "$python" -m pytest -q -p no:cacheprovider "$@"
        stop_spinning;;
      one-core)
        echo "stress-suite: round $round of $rounds, on one core (taskset -c 0)"
        taskset -c 0 "$python" -m pytest -q -p no:cacheprovider "$@";;
      *)
        echo "stress-suite: unknown mode '$mode' in STRESS_MODES (expected busy or one-core)" >&2
        exit 2;;
    esac
    echo "stress-suite: round $round, $mode: green in $((SECONDS - start)) s"
  done
done
