#!/bin/sh
# The plan every rank computes for itself must be the same: mfsdp-plan --json in two processes
# whose heaps start differently (glibc's MALLOC_PERTURB_ fills fresh and freed memory with another
# byte in each), for every placement and with owners spread over nodes. Exit 1 on a difference.
#   plans_across_processes.sh MFSDP_PLAN CONFIG
set -eu
plan=$1 config=$2
for args in "--placement matrixfsdp" "--placement fsdp2" "--placement zero1" "--placement ddp" \
            "--placement matrixfsdp --ranks-per-node 4"; do
  # shellcheck disable=SC2086
  a=$(MALLOC_PERTURB_=1 "$plan" --config "$config" --world-size 8 --json $args)
  # shellcheck disable=SC2086
  b=$(MALLOC_PERTURB_=254 "$plan" --config "$config" --world-size 8 --json $args)
  [ -n "$a" ] || { echo "plans_across_processes.sh: no plan for $args"; exit 1; }
  [ "$a" = "$b" ] || { echo "plans_across_processes.sh: two processes planned differently for $args"; exit 1; }
  echo "$args: the same plan ($(printf %s "$a" | wc -c) bytes of JSON) in both processes"
done
