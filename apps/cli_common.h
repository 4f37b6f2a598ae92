// What every command-line tool of apps/ shares: parsing with one exit-code rule, the bounds of
// the numeric options they have in common, and their --json output file.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/core/cpu_affinity.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/name_table.h"

namespace mfsdp::cli {

/// Bounds of numeric options several tools share (anything beyond is a typo, and would
/// otherwise overflow a size computation or exhaust memory before the first line of output).
inline constexpr int kMaxThreads = kMaxCpuThreads;  ///< CPU threads
inline constexpr int kMaxBatch = 1 << 16;         ///< sequences per rank (-B)
inline constexpr int kMaxSeq = 1 << 20;           ///< tokens per sequence (-T)
inline constexpr int kMaxLayers = 1 << 12;        ///< a preset's layer override
inline constexpr int kMaxNsSteps = 100;           ///< Newton-Schulz iterations
inline constexpr int kMaxReplicas = 1 << 16;      ///< HSDP replicas R
inline constexpr int kMaxWorld = 1 << 20;         ///< projected world sizes
inline constexpr int kMaxSteps = 1000000;         ///< benchmark steps or repetitions

/// Parses argv. Returns -1 to go on; 0 after --help (printed); 2 after a bad command line, with
/// CLI11's message (the option and the allowed range) on stderr.
inline int parse_or_exit_code(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

/// "" when a --json output can be written to `path` (checked before any work, so a bad path
/// costs nothing), else "<tool>: --json: <why>".
inline std::string json_output_problem(const char* tool, const std::string& path) {
  if (path.empty()) return "";
  const std::string e = output_file_problem(path);
  return e.empty() ? "" : std::string(tool) + ": --json: " + e;
}

/// Writes a --json output (write_file_swap: a temporary beside it, renamed when complete).
/// Returns 0, or prints "<tool>: --json: <why>" on stderr and returns 2.
inline int write_json_output(const char* tool, const std::string& path, const std::string& text) {
  try {
    write_file_swap(path, text);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: --json: %s\n", tool, e.what());
    return 2;
  }
  return 0;
}

/// Adds option `name` whose value is one of `table`'s names, stored typed: `target` becomes the
/// table's value for the name given (CLI11 refuses any other name, listing the choices). The
/// help shows `target`'s name as the default.
template <class E, size_t N>
CLI::Option* add_choice(CLI::App& app, const std::string& name, E& target, const NameTable<E, N>& table,
                        const std::string& help) {
  return app
      .add_option_function<std::string>(
          name, [&target, &table](const std::string& s) { target = *table.find(s); }, help)
      ->check(CLI::IsMember(table.names()))
      ->default_str(table.name(target));
}

}  // namespace mfsdp::cli
