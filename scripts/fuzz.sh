#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, -fsanitize=fuzzer,address,undefined) into
# build-fuzz/ and runs each for a bounded time from its committed seed corpus (copied, so the
# repository is not modified). Usage: scripts/fuzz.sh [seconds per target, default 15]
# Exit 0 when no target crashed, 1 when one did (its reproducer is kept in build-fuzz/crashes),
# 77 when clang with libFuzzer is not available.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-15}
CXX=${FUZZ_CXX:-clang++}
if ! command -v "$CXX" >/dev/null || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long){return 0;}' |
    "$CXX" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz.sh: skipped: $CXX with libFuzzer (Debian clang, libclang-rt-dev) is not available"
  exit 77
fi
OUT="$PWD/build-fuzz"  # absolute: a target may change its working directory
mkdir -p "$OUT/crashes"
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fopenmp -I. -Itests/fuzz)
declare -A SOURCES=(
  [config]="apps/train/train_config.cpp apps/train/train_config_json.cpp apps/train/config_file.cpp apps/train/preemption.cpp runtime/engine/resolve.cpp runtime/cuda/cudnn_attention_stub.cpp models/gpt_spec.cpp models/llama_spec.cpp models/moe_spec.cpp planner/param_spec.cpp planner/shard_plan.cpp planner/cost_model.cpp runtime/data/token_shards.cpp optim/muon_options.cpp optim/schedule.cpp"
  [safetensors]="checkpoint/safetensors.cpp"
  [token_shard]="runtime/data/token_shards.cpp"
  [tokenizer]="runtime/data/tokenizer.cpp runtime/data/bpe.cpp runtime/data/token_shards.cpp"
  [hf_config]="models/hf_checkpoint.cpp checkpoint/safetensors.cpp"
  [jsonl]="runtime/data/prepare.cpp runtime/data/tokenizer.cpp runtime/data/bpe.cpp runtime/data/token_shards.cpp"
  [prepare_cli]="apps/mfsdp_prepare.cpp runtime/data/prepare.cpp runtime/data/tokenizer.cpp runtime/data/bpe.cpp runtime/data/token_shards.cpp"
)
# A tool's command line: its main() under another name, its data directory where the build puts it.
declare -A EXTRA=(
  [prepare_cli]="-Dmain=prepare_main -DMFSDP_SOURCE_DIR=\"$PWD\""
)
status=0
for target in config safetensors token_shard tokenizer hf_config jsonl prepare_cli; do
  exe="$OUT/fuzz_$target"
  # shellcheck disable=SC2086
  "$CXX" "${FLAGS[@]}" ${EXTRA[$target]:-} "tests/fuzz/fuzz_$target.cpp" ${SOURCES[$target]} -o "$exe" $(pkg-config --cflags --libs libpcre2-8)
  corpus="$OUT/corpus_$target"
  rm -rf "$corpus" && mkdir -p "$corpus" && cp tests/fuzz/corpus/$target/* "$corpus/"
  echo "fuzz.sh: fuzz_$target for ${SECONDS_EACH}s"
  if ! UBSAN_OPTIONS=halt_on_error=1 "$exe" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$OUT/crashes/${target}_" -print_final_stats=1 "$corpus" >"$OUT/fuzz_$target.log" 2>&1; then
    echo "fuzz.sh: fuzz_$target FOUND A CRASH:"; tail -40 "$OUT/fuzz_$target.log"; status=1
  else
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$OUT/fuzz_$target.log" | tail -1 || true
  fi
done
exit $status
